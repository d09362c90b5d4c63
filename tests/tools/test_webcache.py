"""The run's web cache: a resume or a second attempt reuses what search and browse fetched (zero requests to the
fixture server, counted), a replay serves the saved results and refuses anything else without a network call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flowllm.emulator.web import FIXTURES_ENV, WebFixtures, fixture_url
from flowllm.tools.browse import BrowseError, Browser, UrlPolicy
from flowllm.tools.search import Backend, SearchClient, SearchError, cached_search
from flowllm.tools.web.cache import CacheMode, WebCache, read_stats, request_key

pytest.importorskip("trafilatura")

PAGE = fixture_url("/wiki/Harbor_Point_Lighthouse")


@pytest.fixture
def web() -> Iterator[WebFixtures]:
    with WebFixtures() as server:
        yield server


async def test_a_resumed_run_reads_pages_and_searches_from_the_cache(web: WebFixtures, tmp_path: Path) -> None:
    folder = tmp_path / "web_cache"
    client = SearchClient.from_environment(Backend.SEARXNG, fixtures=True, environ={FIXTURES_ENV: web.base_url})
    first = await Browser(UrlPolicy(web.base_url), cache=WebCache(folder)).text(PAGE)
    found = await cached_search(client, WebCache(folder), "Harbor Point Lighthouse", 3)
    with pytest.raises(BrowseError, match="HTTP 404"):
        await Browser(UrlPolicy(web.base_url), cache=WebCache(folder)).text(fixture_url("/gone"))
    before = sum(web.requests.values())
    assert before == 3
    # A new session (resume, pass@k attempt): new server processes, same cache folder.
    again = WebCache(folder)
    assert await Browser(UrlPolicy(web.base_url), cache=again).text(PAGE) == first
    assert await cached_search(client, again, "Harbor Point Lighthouse", 3) == found
    with pytest.raises(BrowseError, match="HTTP 404"):  # an answer about the page is kept too
        await Browser(UrlPolicy(web.base_url), cache=again).text(fixture_url("/gone"))
    assert sum(web.requests.values()) == before
    assert (again.stats.hits, again.stats.misses) == (3, 0)
    assert read_stats(folder).hits == 3 and read_stats(folder).misses == 3
    assert (folder / request_key("read_url", {"url": PAGE})[:2]).is_dir()


async def test_a_replay_serves_saved_results_and_refuses_new_requests(web: WebFixtures, tmp_path: Path) -> None:
    folder = tmp_path / "web_cache"
    await Browser(UrlPolicy(web.base_url), cache=WebCache(folder)).text(PAGE)
    before = sum(web.requests.values())
    replay = WebCache(folder, CacheMode.REPLAY)
    assert "38 m" in await Browser(UrlPolicy(web.base_url), cache=replay).text(PAGE)
    with pytest.raises(BrowseError, match="not called with these arguments in the replayed run"):
        await Browser(UrlPolicy(web.base_url), cache=replay).text(fixture_url("/wiki/Tessaly_survey"))
    client = SearchClient.from_environment(Backend.SEARXNG, fixtures=True, environ={FIXTURES_ENV: web.base_url})
    with pytest.raises(SearchError, match="replayed run"):
        await cached_search(client, replay, "anything", 3)
    assert sum(web.requests.values()) == before


async def test_timeouts_are_not_cached(web: WebFixtures, tmp_path: Path) -> None:
    from flowllm.tools.browse import BrowseLimits

    cache = WebCache(tmp_path / "c")
    slow = Browser(UrlPolicy(web.base_url), BrowseLimits(total_s=0.5, read_s=0.3), cache=cache)
    with pytest.raises(BrowseError, match=r"gave up|did not answer"):
        await slow.text(fixture_url("/slow?seconds=20"))
    assert cache.stats.saved == 0
