"""``tool-search``: an MCP server (stdio) with one tool, ``web_search(query, num_results)``.

Run it as ``python -m flowllm.tools.search --backend serper``. Backends (``tools.search.backend``): Serper
(Google results), Brave, Tavily and a self-hosted SearXNG instance (``--searxng-url`` or ``$SEARXNG_URL``); each
answer is normalised to one list of results (title, url, snippet, date when the backend gives one). The key is
read from the variable the backend names (``KEY_ENV``; the tool config's ``requires_env``), never from config.
With ``--fixtures`` the requests go to the run's web fixture server (``$FLOWLLM_WEB_FIXTURES``), which speaks
each backend's wire shape (flowllm/emulator/web.py).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

from flowllm.config.search_keys import KEY_ENV, Backend
from flowllm.core.registry import Registry
from flowllm.emulator.web import FIXTURES_ENV
from flowllm.tools.web.cache import CachedError, ReplayMiss, WebCache
from flowllm.tools.web.guard import Block, Guard

SERVER_NAME = "tool-search"
MAX_RESULTS = 20


ENDPOINTS: dict[Backend, str] = {
    Backend.SERPER: "https://google.serper.dev/search",
    Backend.BRAVE: "https://api.search.brave.com/res/v1/web/search",
    Backend.TAVILY: "https://api.tavily.com/search",
}
FIXTURE_PATHS: dict[Backend, str] = {
    Backend.SERPER: "/serper/search",
    Backend.BRAVE: "/brave/res/v1/web/search",
    Backend.TAVILY: "/tavily/search",
    Backend.SEARXNG: "/searxng/search",
}
SEARXNG_URL_ENV = "SEARXNG_URL"


class SearchError(Exception):
    """A search that failed; the message is what the model is told."""


def parse_backend(name: str) -> Backend:
    backends = Registry.of_enum("tools.search.backend", Backend, error=SearchError)
    return backends.require(str(name).strip().lower())


def required_env(name: str) -> list[str]:
    """The ``requires_env`` of a backend: the pool disables tool-search with one warning when it is unset."""
    key = KEY_ENV[parse_backend(name)]
    return [key] if key else []


@dataclass(frozen=True)
class SearchResult:
    title: str
    url: str
    snippet: str
    date: str | None = None


@dataclass(frozen=True)
class SearchClient:
    backend: Backend
    endpoint: str
    key: str | None
    timeout_s: float = 20.0

    @classmethod
    def from_environment(
        cls, backend: Backend, *, fixtures: bool = False, searxng_url: str | None = None, environ: Mapping[str, str]
    ) -> SearchClient:
        key_env = KEY_ENV[backend]
        key = environ.get(key_env) if key_env else None
        if key_env and not key:
            raise SearchError(f"the {backend.value} backend needs ${key_env}")
        if fixtures:
            base = environ.get(FIXTURES_ENV)
            if not base:
                raise SearchError(f"--fixtures needs ${FIXTURES_ENV} (the run's web fixture server)")
            return cls(backend, base.rstrip("/") + FIXTURE_PATHS[backend], key)
        if backend is Backend.SEARXNG:
            url = searxng_url or environ.get(SEARXNG_URL_ENV)
            if not url:
                raise SearchError(f"the searxng backend needs tools.search.searxng_url or ${SEARXNG_URL_ENV}")
            return cls(backend, url.rstrip("/") + "/search", None)
        return cls(backend, ENDPOINTS[backend], key)

    async def search(self, query: str, num_results: int = 10) -> list[SearchResult]:
        if not query.strip():
            raise SearchError("the query is empty")
        num = max(1, min(int(num_results), MAX_RESULTS))
        try:
            async with httpx2.AsyncClient(timeout=self.timeout_s, trust_env=False) as client:
                response = await self._request(client, query, num)
        except httpx2.TimeoutException:
            raise SearchError(f"the {self.backend.value} search did not answer within {self.timeout_s:g} s") from None
        except httpx2.HTTPError as exc:
            raise SearchError(f"could not reach the {self.backend.value} search: {exc}") from None
        if response.status_code in (401, 403, 422) and self.backend is not Backend.SEARXNG:
            raise SearchError(
                f"the {self.backend.value} search refused the key (HTTP {response.status_code}): "
                f"check ${KEY_ENV[self.backend]}"
            )
        if response.status_code == 429:
            raise SearchError(f"the {self.backend.value} search is rate limited (HTTP 429): try again later")
        if response.status_code >= 400:
            raise SearchError(f"the {self.backend.value} search failed: HTTP {response.status_code}")
        try:
            data = response.json()
        except ValueError:
            raise SearchError(f"the {self.backend.value} search answered with something that is not JSON") from None
        return normalise(self.backend, data)[:num]

    async def _request(self, client: httpx2.AsyncClient, query: str, num: int) -> httpx2.Response:
        if self.backend is Backend.SERPER:
            return await client.post(
                self.endpoint, json={"q": query, "num": num}, headers={"X-API-KEY": self.key or ""}
            )
        if self.backend is Backend.BRAVE:
            headers = {"X-Subscription-Token": self.key or "", "Accept": "application/json"}
            return await client.get(self.endpoint, params={"q": query, "count": num}, headers=headers)
        if self.backend is Backend.TAVILY:
            body = {"query": query, "max_results": num, "search_depth": "basic"}
            return await client.post(self.endpoint, json=body, headers={"Authorization": f"Bearer {self.key}"})
        return await client.get(self.endpoint, params={"q": query, "format": "json"})


def _text(value: Any) -> str:
    return " ".join(str(value).split()) if value is not None else ""


def normalise(backend: Backend, data: Any) -> list[SearchResult]:
    """Each backend's documented answer as one list of results; entries without a URL are skipped."""
    if not isinstance(data, dict):
        raise SearchError(f"the {backend.value} search answered with an unexpected shape")
    if backend is Backend.SERPER:
        rows, keys = data.get("organic"), ("title", "link", "snippet", "date")
    elif backend is Backend.BRAVE:
        rows, keys = (data.get("web") or {}).get("results"), ("title", "url", "description", "page_age")
    elif backend is Backend.TAVILY:
        rows, keys = data.get("results"), ("title", "url", "content", "published_date")
    else:
        rows, keys = data.get("results"), ("title", "url", "content", "publishedDate")
    results = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or not row.get(keys[1]):
            continue
        date = row.get(keys[3]) or (row.get("age") if backend is Backend.BRAVE else None)
        results.append(
            SearchResult(_text(row.get(keys[0])), str(row[keys[1]]), _text(row.get(keys[2])), _text(date) or None)
        )
    return results


def format_results(query: str, results: list[SearchResult], withheld: list[Block] | None = None) -> str:
    """The results as the model reads them; ``withheld``: those the contamination guard dropped, one line each."""
    notes = [block.withheld() for block in withheld or []]
    if not results:
        return "\n".join([f"No results for '{query}'.", *notes])
    lines = [f"{len(results)} result(s) for '{query}':"]
    for n, result in enumerate(results, start=1):
        lines.append(f"\n{n}. {result.title}\n   URL: {result.url}")
        if result.date:
            lines.append(f"   Date: {result.date}")
        if result.snippet:
            lines.append(f"   {result.snippet}")
    if notes:
        lines.append("\n" + "\n".join(notes))
    lines.append("\nRead a result with read_url(url).")
    return "\n".join(lines)


async def cached_search(
    client: SearchClient | None,
    cache: WebCache,
    query: str,
    num_results: int = 10,
    *,
    backend: Backend | None = None,
    problem: str | None = None,
    guard: Guard | None = None,
) -> str:
    """The formatted results, from the run's web cache when this search was made before (a replay needs no
    working client: it never searches). Results from a benchmark answer source (``guard``) are withheld before
    the text is cached."""
    name = (client.backend if client is not None else backend or Backend.SERPER).value
    args = {"backend": name, "query": query, "num_results": num_results}

    async def fetch() -> str:
        if client is None:
            raise SearchError(f"web search is not available: {problem}")
        results = await client.search(query, num_results)
        kept, blocks = (guard or Guard(())).split(r.url for r in results)
        return format_results(query, [results[n] for n in kept], blocks)

    try:
        return await cache.get("web_search", args, fetch)
    except (CachedError, ReplayMiss) as exc:
        raise SearchError(str(exc)) from None


def build_server(
    client: SearchClient | None,
    problem: str | None = None,
    cache: WebCache | None = None,
    backend: Backend | None = None,
    guard: Guard | None = None,
) -> MCPServer:
    server = MCPServer(SERVER_NAME, instructions="Searches the web.", log_level="WARNING")
    web_cache = cache or WebCache(None)

    async def web_search(query: str, num_results: int = 10) -> CallToolResult:
        try:
            text = await cached_search(
                client, web_cache, query, num_results, backend=backend, problem=problem, guard=guard
            )
        except SearchError as exc:
            raise ToolError(str(exc)) from None
        blocks = Block.told_in(text)  # the withheld results: recorded with the result (flowllm/tools/web/guard.py)
        structured = Block.record("web_search", blocks) if blocks else None
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)

    server.add_tool(
        web_search,
        name="web_search",
        description=(
            "Search the web. Returns up to 'num_results' results (default 10, at most 20), each with its title, "
            "URL, date when known and a snippet. Read a result's page with read_url."
        ),
        structured_output=False,
    )
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flowllm.tools.search", description=__doc__)
    parser.add_argument("--backend", default="serper", help="serper, brave, tavily or searxng")
    parser.add_argument("--searxng-url", default=None, help="the SearXNG instance (default: $SEARXNG_URL)")
    parser.add_argument(
        "--fixtures",
        default="false",
        type=str.lower,
        choices=["true", "false"],
        help="use the run's web fixture server",
    )
    args = parser.parse_args(argv)
    backend: Backend | None = None
    try:
        backend = parse_backend(args.backend)
        client: SearchClient | None = SearchClient.from_environment(
            backend, fixtures=args.fixtures == "true", searxng_url=args.searxng_url or None, environ=os.environ
        )
        problem = None
    except SearchError as exc:  # the server still starts, so the model is told why instead of a dead tool
        client, problem = None, str(exc)
    build_server(client, problem, WebCache.from_environment(), backend, Guard.from_environment()).run()


if __name__ == "__main__":
    main()
