"""``tool-browse``: an MCP server (stdio) with ``read_url(url, start)`` and ``find_in_url(url, text)``.

Run it as ``python -m flowllm.tools.browse``. A page is fetched with httpx2 (redirects followed one hop at a
time, each hop checked; a size cap, a per-read and a total time cap), then turned into text: HTML to the
page's main content as markdown with trafilatura (navigation, cookie banners, sidebars and footers dropped;
markitdown's converter when trafilatura finds no main content), PDFs, office files, CSV, JSON and XML through
the converter ``read_file`` uses (``flowllm.tools.web.documents``). Long pages come in pages of ``--page-chars``
characters with a note saying how to read on.

Only public http(s) addresses are fetched: ``file:``, ``ftp:`` and other schemes, ``localhost``, loopback,
private, link-local (169.254.*, the cloud metadata address), multicast and reserved addresses are refused, for
names after resolving them. ``*.web.test`` names go to the run's web fixture server when the run started one
(``$FLOWLLM_WEB_FIXTURES``), which is the only loopback address a run may reach. A URL from a benchmark answer
source (``tools.web.block``, flowllm/tools/web/guard.py), asked for or reached by a redirect, is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import re
import socket
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx2
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

from flowllm.emulator.web import FIXTURE_DOMAIN, FIXTURES_ENV
from flowllm.tools.needs import PAGE_NEEDS, unmet, withdrawn_meta
from flowllm.tools.web.cache import CachedError, ReplayMiss, WebCache
from flowllm.tools.web.documents import DocumentError, Kind, Limits, convert, decode_text, kind_of
from flowllm.tools.web.guard import Block, BlockedSource, Guard
from flowllm.tools.web.readerproc import ReaderProcess

SERVER_NAME = "tool-browse"
DEFAULT_PAGE_CHARS = 12000
MAX_REDIRECTS = 5
USER_AGENT = "Mozilla/5.0 (compatible; flowllm-browse/0.1; +https://github.com/flowllm)"
TEXT_KINDS = {Kind.HTML, Kind.TEXT, Kind.CSV, Kind.JSON, Kind.JSONL, Kind.XML}


class BrowseError(Exception):
    """A URL that cannot be read; the message is what the model is told."""


@dataclass(frozen=True)
class BrowseLimits:
    max_bytes: int = 8 * 1024 * 1024  # documents over this are refused; HTML and text are cut here
    total_s: float = 30.0  # the whole fetch, redirects included: a page that never ends stops here
    read_s: float = 15.0  # silence between two bytes


@dataclass(frozen=True)
class Fetched:
    url: str  # the final URL, after redirects
    content_type: str
    data: bytes
    truncated: bool


@dataclass(frozen=True)
class Target:
    url: str  # what the model asked for (after redirects)
    request_url: str  # where the request really goes (the fixture server for *.web.test)
    host_header: str | None


class UrlPolicy:
    """Which URLs may be fetched (``guard``: not the benchmark answer sources), and where ``*.web.test`` goes."""

    def __init__(self, fixtures: str | None = None, guard: Guard | None = None) -> None:
        self.fixtures = fixtures.rstrip("/") if fixtures else None
        self.guard = guard

    async def target(self, url: str) -> Target:
        if self.guard is not None:
            self.guard.check(url)  # every hop: a redirect to an answer source is refused too
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            shown = f"'{scheme}:'" if scheme else "no scheme"
            raise BrowseError(f"only http:// and https:// URLs can be read ({shown} given)")
        host = (parts.hostname or "").lower().rstrip(".")
        if not host:
            raise BrowseError("the URL has no host name")
        if host == FIXTURE_DOMAIN or host.endswith("." + FIXTURE_DOMAIN):
            if self.fixtures is None:
                raise BrowseError(f"'{host}' is a test domain; this run has no web fixture server for it")
            fixture = urlsplit(self.fixtures)
            request_url = urlunsplit((fixture.scheme, fixture.netloc, parts.path or "/", parts.query, ""))
            return Target(url, request_url, parts.netloc)
        if host == "localhost" or host.endswith(".localhost"):
            raise BrowseError(f"'{host}' is this machine: refused")
        await self._check_public(host, parts.port or (443 if scheme == "https" else 80))
        return Target(url, url, None)

    async def _check_public(self, host: str, port: int) -> None:
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise BrowseError(f"cannot resolve '{host}': {exc.strerror or exc}") from None
            addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
        for address in addresses:
            if not address.is_global or address.is_multicast:
                raise BrowseError(f"'{host}' is a private or local address ({address}): refused")


class Browser:
    """Fetches and converts pages; keeps each URL's text for the life of the server (one task)."""

    def __init__(
        self,
        policy: UrlPolicy,
        limits: BrowseLimits | None = None,
        cache: WebCache | None = None,
        reader: ReaderProcess | None = None,
    ) -> None:
        self.policy = policy
        self.limits = limits or BrowseLimits()
        self.cache = cache or WebCache(None)
        # Where fetched pages and documents are parsed: a capped process of its own (None: in a thread here).
        self.reader = reader
        self._texts: dict[str, str] = {}

    async def fetch(self, url: str) -> Fetched:
        seen: list[str] = []
        try:
            async with asyncio.timeout(self.limits.total_s):
                async with httpx2.AsyncClient(
                    follow_redirects=False,
                    trust_env=False,  # a proxy from the environment must not route around the address checks
                    timeout=httpx2.Timeout(self.limits.read_s, connect=10.0),
                    headers={"user-agent": USER_AGENT, "accept": "text/html,application/xhtml+xml,*/*;q=0.8"},
                ) as client:
                    while True:
                        target = await self.policy.target(url)
                        seen.append(url)
                        fetched = await self._get(client, target)
                        if isinstance(fetched, Fetched):
                            return fetched
                        url = urljoin(url, fetched)
                        if url in seen:
                            raise BrowseError(f"redirect loop: {' -> '.join([*seen, url])}")
                        if len(seen) > MAX_REDIRECTS:
                            raise BrowseError(f"more than {MAX_REDIRECTS} redirects (last: {url})")
        except TimeoutError:
            raise BrowseError(f"gave up after {self.limits.total_s:g} s: the page did not finish loading") from None
        except httpx2.TimeoutException:
            raise BrowseError(f"the server did not answer within {self.limits.read_s:g} s") from None
        except httpx2.HTTPError as exc:
            raise BrowseError(f"could not fetch the page: {type(exc).__name__}: {exc}") from None

    async def _get(self, client: httpx2.AsyncClient, target: Target) -> Fetched | str:
        headers = {"host": target.host_header} if target.host_header else {}
        async with client.stream("GET", target.request_url, headers=headers) as response:
            if response.status_code in (301, 302, 303, 307, 308) and "location" in response.headers:
                return response.headers["location"]
            if response.status_code >= 400:
                reason = response.reason_phrase or "error"
                raise BrowseError(f"HTTP {response.status_code} {reason} for {target.url}")
            content_type = response.headers.get("content-type", "")
            kind = kind_of(PurePosixPath(urlsplit(target.url).path).name, content_type)
            if kind is Kind.TEXT and content_type and not _texty(content_type):
                raise BrowseError(
                    f"{target.url} is a binary download ({content_type.split(';')[0]}), not a page or document"
                )
            body = bytearray()
            truncated = False
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.limits.max_bytes:
                    if kind not in TEXT_KINDS:
                        raise BrowseError(
                            f"{target.url} is larger than {self.limits.max_bytes:,} bytes, too large to read here"
                        )
                    del body[self.limits.max_bytes :]
                    truncated = True
                    break
            return Fetched(target.url, content_type, bytes(body), truncated)

    async def text(self, url: str) -> str:
        """The page's text: from this task's memory, else the run's web cache, else the network."""
        if url in self._texts:
            return self._texts[url]
        try:
            text = await self.cache.get("read_url", {"url": url}, lambda: self._fetch_text(url))
        except (CachedError, ReplayMiss, BlockedSource) as exc:  # a refusal is cached: a resume refuses again
            raise BrowseError(str(exc)) from None
        self._texts[url] = text
        return text

    async def _fetch_text(self, url: str) -> str:
        fetched = await self.fetch(url)
        if self.reader is None:
            return await asyncio.to_thread(page_text, fetched)
        try:
            return await asyncio.to_thread(self.reader.run, page_text, fetched)
        except DocumentError as exc:
            raise BrowseError(f"cannot read {fetched.url}: {exc}") from None


def _texty(content_type: str) -> bool:
    base = content_type.split(";")[0].strip().lower()
    return base.startswith("text/") or base.endswith(("+xml", "+json")) or base in ("application/javascript",)


def _charset(content_type: str) -> str | None:
    match = re.search(r"charset=\"?([\w.:-]+)", content_type, re.IGNORECASE)
    return match.group(1) if match else None


def html_to_markdown(html: str) -> str:
    """The main content of a page as markdown (trafilatura), else the whole body (markitdown)."""
    import trafilatura

    main = trafilatura.extract(
        html,
        output_format="markdown",
        include_tables=True,
        include_links=False,
        include_comments=False,
        favor_recall=True,
    )
    if main and main.strip():
        return main.strip()
    return convert(html.encode("utf-8"), "page.html", charset="utf-8")


def page_text(fetched: Fetched) -> str:
    """What the model is shown for a fetched URL."""
    name = PurePosixPath(urlsplit(fetched.url).path).name
    kind = kind_of(name, fetched.content_type)
    charset = _charset(fetched.content_type)
    try:
        if kind is Kind.HTML:
            text = html_to_markdown(decode_text(fetched.data, charset))
        elif kind is Kind.IMAGE:
            raise BrowseError(f"{fetched.url} is an image: use ask_image to look at it")
        elif kind is Kind.AUDIO:
            raise BrowseError(f"{fetched.url} is an audio file: download it with run_python and use transcribe")
        else:
            text = convert(
                fetched.data,
                name or "download",
                mime=fetched.content_type,
                charset=charset,
                limits=Limits(max_bytes=len(fetched.data) + 1),
            )
    except DocumentError as exc:
        raise BrowseError(f"cannot read {fetched.url}: {exc}") from None
    if fetched.truncated:
        text += f"\n[the download was cut at {len(fetched.data):,} bytes: the page is larger than that]"
    return text


def paged(text: str, url: str, start: int, page_chars: int) -> str:
    total = len(text)
    if start < 0:
        raise BrowseError("start must be 0 or more")
    if start >= total and total > 0:
        raise BrowseError(f"start={start} is past the end of the page ({total:,} characters)")
    end = min(total, start + page_chars)
    chunk = text[start:end]
    if start == 0 and end == total:
        return chunk
    note = f"[showing characters {start:,}-{end:,} of {total:,}"
    note += f"; call read_url with start={end} for more]" if end < total else "; end of page]"
    return f"{chunk}\n{note}"


def find_text(text: str, needle: str, page_chars: int, limit: int = 10, context: int = 300) -> str:
    if not needle.strip():
        raise BrowseError("give the text to look for")
    hits = [m.start() for m in re.finditer(re.escape(needle.strip()), text, re.IGNORECASE)]
    if not hits:
        return f"'{needle}' does not occur on the page ({len(text):,} characters)."
    parts = [f"'{needle}' occurs {len(hits)} time(s) on the page ({len(text):,} characters)."]
    for position in hits[:limit]:
        lo, hi = max(0, position - context), min(len(text), position + len(needle) + context)
        page_start = (position // page_chars) * page_chars
        parts.append(f"\n--- at character {position:,} (read_url start={page_start}) ---\n{text[lo:hi]}")
    if len(hits) > limit:
        parts.append(f"\n[{len(hits) - limit} more occurrence(s) not shown]")
    return "\n".join(parts)


def _text_result(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)])


def _refusal(tool: str, message: str) -> CallToolResult:
    """An error for the model; a refused answer source is also recorded in the result (guard.py)."""
    blocks = Block.told_in(message)
    if not blocks:
        raise ToolError(message)
    return CallToolResult(
        content=[TextContent(type="text", text=message)],
        structured_content=Block.record(tool, blocks),
        is_error=True,
    )


def build_server(browser: Browser, page_chars: int = DEFAULT_PAGE_CHARS, unavailable: str | None = None) -> MCPServer:
    """``unavailable``: why this server cannot read pages here (a reader library missing); both tools are then
    listed as withdrawn (``flowllm.tools.needs``) and answer with the reason if called anyway."""
    server = MCPServer(SERVER_NAME, instructions="Reads web pages and online documents.", log_level="WARNING")
    meta = withdrawn_meta(unavailable) if unavailable else None

    async def read_url(url: str, start: int = 0) -> CallToolResult:
        if unavailable:
            raise ToolError(unavailable)
        try:
            return _text_result(paged(await browser.text(url), url, start, page_chars))
        except BrowseError as exc:
            return _refusal("read_url", str(exc))

    async def find_in_url(url: str, text: str) -> CallToolResult:
        if unavailable:
            raise ToolError(unavailable)
        try:
            return _text_result(find_text(await browser.text(url), text, page_chars))
        except BrowseError as exc:
            return _refusal("find_in_url", str(exc))

    server.add_tool(
        read_url,
        name="read_url",
        meta=meta,
        description=(
            "Read a web page or an online document (PDF, Word, Excel, PowerPoint, CSV, JSON) given its http(s) "
            "URL. Pages come back as the main content in markdown, without menus and banners. Long pages come "
            f"in pages of {page_chars:,} characters: pass 'start' (a character position) to read further."
        ),
        structured_output=False,
    )
    server.add_tool(
        find_in_url,
        name="find_in_url",
        meta=meta,
        description=(
            "Find a word or phrase (case-insensitive) on a web page or online document: each occurrence with "
            "the text around it and the 'start' to pass to read_url to read that part."
        ),
        structured_output=False,
    )
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flowllm.tools.browse", description=__doc__)
    parser.add_argument("--page-chars", type=int, default=DEFAULT_PAGE_CHARS, help="characters per read_url page")
    parser.add_argument("--max-bytes", type=int, default=BrowseLimits.max_bytes, help="download size cap")
    parser.add_argument("--total-s", type=float, default=BrowseLimits.total_s, help="time cap per fetch")
    args = parser.parse_args(argv)
    policy = UrlPolicy(os.environ.get(FIXTURES_ENV) or None, Guard.from_environment())
    limits = BrowseLimits(max_bytes=args.max_bytes, total_s=args.total_s)
    reader = ReaderProcess()
    reader.warn_if_not_isolated(SERVER_NAME)
    browser = Browser(policy, limits, WebCache.from_environment(), reader)
    unavailable = unmet(PAGE_NEEDS, "reading web pages and online documents")
    build_server(browser, args.page_chars, unavailable).run()


if __name__ == "__main__":
    # Run the module's own copy, not __main__'s: the document reader's worker receives page_text and Fetched by
    # their importable names (flowllm.tools.browse.*), which objects defined in __main__ would not have.
    from flowllm.tools.browse import main as _main

    _main()
