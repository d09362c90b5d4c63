"""tool-browse against the web fixture server: main content kept and boilerplate gone, paging, documents by URL,
and every bad input a clear error (redirect loop, 4xx/5xx, binary, endless and huge pages, private URLs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowllm.emulator.web import WebFixtures, fixture_url, minimal_pdf
from flowllm.tools.browse import BrowseError, BrowseLimits, Browser, UrlPolicy, find_text, paged

pytest.importorskip("trafilatura")
pytest.importorskip("markitdown")


@pytest.fixture(scope="module")
def web() -> Iterator[WebFixtures]:
    with WebFixtures() as server:
        yield server


@pytest.fixture
def browser(web: WebFixtures) -> Browser:
    return Browser(UrlPolicy(web.base_url), BrowseLimits(max_bytes=2 * 1024 * 1024, total_s=20, read_s=10))


async def test_an_article_keeps_its_content_and_table_and_drops_the_boilerplate(browser: Browser) -> None:
    text = await browser.text(fixture_url("/wiki/Harbor_Point_Lighthouse"))
    assert text.startswith("# Harbor Point Lighthouse")
    assert "Margaret Ellery" in text and "| Height | 38 m |" in text and "Thomas Varga" in text
    for boilerplate in ("cookie", "Trending story", "Advertisement", "All rights reserved", "Donate", "analytics"):
        assert boilerplate.lower() not in text.lower()


async def test_a_redirect_is_followed_to_the_table(browser: Browser) -> None:
    text = await browser.text(fixture_url("/go/longest-bridge"))
    assert "| Kestrel Crossing | 1,104 | 1968 |" in text


async def test_a_windows_1252_page_is_decoded(browser: Browser) -> None:
    text = await browser.text(fixture_url("/de/cafe-mueller"))
    assert "Jürgen Weiß" in text and "Zürich" in text


async def test_a_pdf_by_url_goes_through_the_document_converter(browser: Browser) -> None:
    text = await browser.text(fixture_url("/reports/heritage-trust-2023.pdf", "reports"))
    assert text.startswith("[PDF,") and "Total visitors: 48,213" in text


async def test_long_pages_come_in_pages_and_find_points_at_the_right_one(browser: Browser) -> None:
    url = fixture_url("/wiki/Tessaly_survey")
    text = await browser.text(url)
    first = paged(text, url, 0, 5000)
    assert "17.42 days" not in first
    assert first.endswith(f"[showing characters 0-5,000 of {len(text):,}; call read_url with start=5000 for more]")
    found = find_text(text, "orbital period", 5000)
    assert found.startswith("'orbital period' occurs 1 time(s)")
    start = int(found.split("read_url start=")[1].split(")")[0])
    assert "17.42 days" in paged(text, url, start, 5000)
    with pytest.raises(BrowseError, match="past the end"):
        paged(text, url, len(text) + 1, 5000)


async def test_a_huge_page_is_cut_at_the_size_cap_with_a_note(browser: Browser) -> None:
    text = await browser.text(fixture_url("/huge"))
    assert "the answer is 42" in text
    assert text.endswith("[the download was cut at 2,097,152 bytes: the page is larger than that]")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/nowhere", r"HTTP 404 Not Found for http://encyclopedia\.web\.test/nowhere"),
        ("/error", "HTTP 500 Internal Server Error"),
        ("/loop/1", r"redirect loop: .*/loop/1 -> .*/loop/2 -> .*|more than 5 redirects"),
        ("/download.bin", r"is a binary download \(application/octet-stream\)"),
    ],
)
async def test_bad_pages_are_clear_errors(browser: Browser, path: str, message: str) -> None:
    with pytest.raises(BrowseError, match=message):
        await browser.text(fixture_url(path))


async def test_a_page_that_never_ends_and_a_slow_page_hit_the_time_cap(web: WebFixtures) -> None:
    browser = Browser(UrlPolicy(web.base_url), BrowseLimits(max_bytes=1 << 40, total_s=1.0, read_s=0.5))
    with pytest.raises(BrowseError, match=r"gave up after 1 s|did not answer within"):
        await browser.text(fixture_url("/endless"))
    with pytest.raises(BrowseError, match=r"gave up after 1 s|did not answer within"):
        await browser.text(fixture_url("/slow?seconds=30"))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///etc/passwd", "only http:// and https://"),
        ("ftp://example.org/x", "only http:// and https://"),
        ("http://169.254.169.254/latest/meta-data/", "private or local address"),
        ("http://127.0.0.1:1/", "private or local address"),
        ("http://[::1]/", "private or local address"),
        ("http://10.0.0.8/admin", "private or local address"),
        ("http://localhost:8080/", "is this machine"),
        ("http://api.localhost/", "is this machine"),
        ("http:///path", "no host name"),
    ],
)
async def test_private_and_non_http_urls_are_refused(browser: Browser, url: str, message: str) -> None:
    with pytest.raises(BrowseError, match=message):
        await browser.text(url)


async def test_the_fixture_domain_needs_a_fixture_server() -> None:
    with pytest.raises(BrowseError, match="no web fixture server"):
        await Browser(UrlPolicy(None)).text(fixture_url("/wiki/Harbor_Point_Lighthouse"))


async def test_a_redirect_to_a_private_address_is_refused(browser: Browser, web: WebFixtures) -> None:
    # The fixture server itself is loopback: reaching it by its real address (not *.web.test) is refused.
    with pytest.raises(BrowseError, match="private or local address"):
        await browser.text(web.base_url + "/wiki/Harbor_Point_Lighthouse")


def test_the_fixture_pdf_is_a_real_pdf() -> None:
    pypdf = pytest.importorskip("pypdf")
    import io

    reader = pypdf.PdfReader(io.BytesIO(minimal_pdf(["Hello (world)"])))
    assert "Hello (world)" in reader.pages[0].extract_text()
