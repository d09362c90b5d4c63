"""The contamination guard's matching: host and subdomains, a path and what lies below it, after every redirect
hop (a redirect to an answer source is refused before it is fetched), and the denylist a run hands its servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowllm.config.answer_sources import DEFAULT_BLOCK
from flowllm.emulator.web import WebFixtures, fixture_url
from flowllm.tools.browse import BrowseError, Browser, UrlPolicy
from flowllm.tools.web.guard import BLOCK_ENV, Block, Guard, env_value


@pytest.fixture(scope="module")
def web() -> Iterator[WebFixtures]:
    with WebFixtures() as server:
        yield server


async def test_a_redirect_to_the_dataset_page_is_refused_before_it_is_fetched(web: WebFixtures) -> None:
    browser = Browser(UrlPolicy(web.base_url, Guard.of(DEFAULT_BLOCK)))
    with pytest.raises(BrowseError, match="is a benchmark answer source") as refused:
        await browser.text(fixture_url("/go/answer-key"))
    (block,) = Block.told_in(str(refused.value))
    assert block == Block(fixture_url("/datasets/gaia-benchmark/GAIA", "huggingface.co"), DEFAULT_BLOCK[0])
    assert web.requests["/go/answer-key"] == 1 and web.requests["/datasets/gaia-benchmark/GAIA"] == 0


def test_entries_match_a_host_its_subdomains_and_a_path_below_them() -> None:
    guard = Guard.of(["Example.org/Data", "answers.test"])
    for url in ("https://example.org/data", "http://www.example.org/DATA/x?q=1", "https://answers.test/anything"):
        assert guard.match(url) is not None, url
    for url in ("https://example.org/database", "https://notexample.org/data", "https://example.org/"):
        assert guard.match(url) is None, url


def test_the_run_hands_its_denylist_to_the_servers_and_refuses_an_entry_without_a_host() -> None:
    assert Guard.from_environment({BLOCK_ENV: env_value([])}).rules == ()
    assert Guard.from_environment({}).match("https://huggingface.co/datasets/cais/hle/tree/main") is not None
    with pytest.raises(ValueError, match="names no host"):
        env_value(["/datasets/x"])
