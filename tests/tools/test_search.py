"""tool-search: each backend's wire shape against its loopback stand-in, one normalised result list, keys only
from the environment, a missing key disabling the server with one warning naming the variable."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowllm.emulator.web import FIXTURES_ENV, WebFixtures
from flowllm.tools import open_tool_pool
from flowllm.tools.search import (
    KEY_ENV,
    Backend,
    SearchClient,
    SearchError,
    SearchResult,
    format_results,
    normalise,
    required_env,
)


@pytest.fixture(scope="module")
def web() -> Iterator[WebFixtures]:
    with WebFixtures() as server:
        yield server


def client_for(backend: Backend, web: WebFixtures, key: str | None = "test-key") -> SearchClient:
    environ = {FIXTURES_ENV: web.base_url}
    if KEY_ENV[backend] and key:
        environ[KEY_ENV[backend]] = key
    return SearchClient.from_environment(backend, fixtures=True, environ=environ)


@pytest.mark.parametrize("backend", list(Backend))
async def test_every_backend_gives_the_same_normalised_results(backend: Backend, web: WebFixtures) -> None:
    results = await client_for(backend, web).search("Harbor Point Lighthouse height", 3)
    assert results[0] == SearchResult(
        "Harbor Point Lighthouse",
        "http://encyclopedia.web.test/wiki/Harbor_Point_Lighthouse",
        "The Harbor Point Lighthouse is a granite lighthouse on Gull Island, first lit in 1871.",
        "2024-03-02",
    )
    assert 1 <= len(results) <= 3


@pytest.mark.parametrize("backend", [Backend.SERPER, Backend.BRAVE, Backend.TAVILY])
async def test_a_key_the_backend_refuses_is_named(backend: Backend, web: WebFixtures) -> None:
    client = client_for(backend, web)
    bare = SearchClient(client.backend, client.endpoint, key="bad-key")
    with pytest.raises(SearchError, match=rf"refused the key \(HTTP 4\d\d\): check \${KEY_ENV[backend]}"):
        await bare.search("lighthouse")


def test_a_missing_key_or_url_is_a_clear_error() -> None:
    with pytest.raises(SearchError, match=r"the brave backend needs \$BRAVE_API_KEY"):
        SearchClient.from_environment(Backend.BRAVE, environ={})
    with pytest.raises(SearchError, match=r"searxng backend needs tools.search.searxng_url or \$SEARXNG_URL"):
        SearchClient.from_environment(Backend.SEARXNG, environ={})
    assert required_env("serper") == ["SERPER_API_KEY"] and required_env("SearXNG") == []
    with pytest.raises(SearchError, match=r"tools\.search\.backend must be one of .*, not 'bing'"):
        required_env("bing")


async def test_an_unreachable_backend_and_an_empty_query() -> None:
    client = SearchClient(Backend.SEARXNG, "http://127.0.0.1:9/search", None, timeout_s=5)
    with pytest.raises(SearchError, match="could not reach the searxng search"):
        await client.search("x")
    with pytest.raises(SearchError, match="the query is empty"):
        await client.search("  ")


def test_results_are_listed_with_how_to_read_them() -> None:
    text = format_results("q", [SearchResult("T", "http://a.example/x", "snip", "2024-01-01")])
    assert text == (
        "1 result(s) for 'q':\n\n1. T\n   URL: http://a.example/x\n   Date: 2024-01-01\n   snip\n\n"
        "Read a result with read_url(url)."
    )
    assert format_results("q", []) == "No results for 'q'."


@given(
    st.sampled_from(list(Backend)),
    st.recursive(
        st.none() | st.text() | st.integers(), lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20
    ),
)
def test_normalise_never_raises_anything_but_search_error(backend: Backend, data: object) -> None:
    with contextlib.suppress(SearchError):
        assert all(isinstance(r, SearchResult) for r in normalise(backend, data))


async def test_a_missing_key_disables_the_server_with_one_warning(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    cfg = {
        "name": "t",
        "servers": {
            "tool-search": {
                "command": "python",
                "args": ["-m", "flowllm.tools.search", "--backend", "serper"],
                "requires_env": required_env("serper"),
            }
        },
    }
    with caplog.at_level(logging.WARNING):
        async with open_tool_pool(cfg, workspace):
            pass
    warnings = [r.getMessage() for r in caplog.records if "tool-search" in r.getMessage()]
    assert warnings == [
        "server 'tool-search' is disabled: environment variable(s) SERPER_API_KEY not set; its tools are not offered"
    ]
