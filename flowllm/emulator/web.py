"""The web fixture server: realistic pages and the search backends' wire shapes on 127.0.0.1, for offline runs.

    with WebFixtures() as web:                  # or: web.start(); ...; web.stop()
        web.base_url                            # http://127.0.0.1:<port>

Pages are routed by path alone; tool-browse sends every ``*.web.test`` host (a reserved test domain) here when
the run gives it this server's address, so tasks and search results name stable URLs such as
``http://encyclopedia.web.test/wiki/Harbor_Point_Lighthouse`` whatever port the server got.

What is served (see ``PAGES`` and the routes below): articles wrapped in navigation, a cookie banner, a sidebar
and a footer (the boilerplate a reader must drop), a table, a PDF, a redirect, a redirect loop, a 404, a 500,
a slow page, a page that never ends, a 20 MB page, a Windows-1252 page, a binary download, a long article
that needs paging, and the two shapes of a benchmark answer leak: a dataset's page listing its answers on a
fixture copy of Hugging Face (``huggingface.co.web.test/datasets/gaia-benchmark/GAIA``, which the web tools'
default denylist refuses, also behind the redirect ``/go/answer-key``) and a forum thread quoting an answer
(``forum.web.test/t/orrin-vale-chandelier``, an ordinary page the contamination audit catches).
The search stand-ins answer in each backend's documented JSON shape, after checking the
key the way the real API expects it: Serper (``POST /serper/search``, ``X-API-KEY``), Brave
(``GET /brave/res/v1/web/search``, ``X-Subscription-Token``), Tavily (``POST /tavily/search``, a Bearer key)
and SearXNG (``GET /searxng/search?format=json``, no key). Results are ranked by word overlap with the query,
from the same pages, so a search leads to a page that exists.
"""

from __future__ import annotations

import asyncio
import collections
import re
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

FIXTURE_DOMAIN = "web.test"
FIXTURES_ENV = "FLOWLLM_WEB_FIXTURES"  # the address tool servers are given (setup/webconf.py)
HUGE_PAGE_BYTES = 20 * 1024 * 1024


def layout(title: str, article: str, *, charset: str = "utf-8") -> str:
    """An article inside the boilerplate real sites put around it."""
    nav = "".join(f'<li><a href="/{n.lower()}">{n}</a></li>' for n in ("Home", "Topics", "Random", "Donate", "Login"))
    sidebar = "".join(f'<li><a href="/trending/{i}">Trending story number {i}</a></li>' for i in range(1, 8))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="{charset}"><title>{title} - Fixture Encyclopedia</title>
<style>.cookie{{position:fixed}} nav li{{display:inline}}</style>
<script>window.analytics = {{track: function() {{}}}}; analytics.track("pageview");</script></head>
<body>
<div class="cookie-banner" id="cookie-consent"><p>We use cookies to improve your experience. By continuing to
browse you accept our cookie policy.</p><button>Accept all cookies</button><button>Manage preferences</button></div>
<header><a class="logo" href="/">Fixture Encyclopedia</a><nav><ul>{nav}</ul></nav>
<form action="/search"><input name="q" placeholder="Search the encyclopedia"></form></header>
<div class="layout"><main><article><h1>{title}</h1>
{article}
</article></main>
<aside class="sidebar"><h3>Trending now</h3><ul>{sidebar}</ul><div class="ad">Advertisement: buy one get one
free at the Fixture Store</div></aside></div>
<footer><p>Copyright 2024 Fixture Encyclopedia Foundation. All rights reserved.</p><p><a href="/privacy">Privacy
policy</a> | <a href="/terms">Terms of use</a> | <a href="/contact">Contact us</a></p></footer>
</body></html>"""


LIGHTHOUSE = """<p>The <b>Harbor Point Lighthouse</b> is a lighthouse on the northern tip of Gull Island. It was
designed by the engineer Margaret Ellery and first lit on 14 September 1871, replacing a wooden beacon that
storms had destroyed twice.</p>
<h2>Structure</h2>
<p>The tower is built of granite blocks quarried on the island itself. Its lantern room holds a second-order
Fresnel lens that was made in Paris.</p>
<table class="infobox"><caption>Harbor Point Lighthouse</caption>
<tr><th>Height</th><td>38 m</td></tr>
<tr><th>Focal height</th><td>52 m</td></tr>
<tr><th>Range</th><td>22 nautical miles</td></tr>
<tr><th>First lit</th><td>1871</td></tr>
<tr><th>Automated</th><td>1984</td></tr></table>
<h2>History</h2>
<p>The last resident keeper, Thomas Varga, left the station when it was automated in 1984. The keeper's
cottage is now a small museum that opens in the summer months.</p>"""

BRIDGES = """<p>This list ranks the suspension bridges of the Meridian River by the length of their main span.</p>
<table class="wikitable"><thead><tr><th>Bridge</th><th>Main span (m)</th><th>Opened</th></tr></thead><tbody>
<tr><td>Old Ferry Bridge</td><td>412</td><td>1903</td></tr>
<tr><td>Kestrel Crossing</td><td>1,104</td><td>1968</td></tr>
<tr><td>Union Gate Bridge</td><td>867</td><td>1937</td></tr>
<tr><td>Saltmarsh Bridge</td><td>655</td><td>1952</td></tr>
</tbody></table>
<p>Spans are measured between the centres of the towers.</p>"""

CAFE = """<p>Das <b>Café Müller</b> wurde 1898 in der Altstadt gegründet. Der Gründer, Jürgen Weiß, stammte aus
Zürich und brachte das Rezept für die berühmte Nusstorte mit.</p>
<p>Heute führt die Urenkelin Käthe Weiß das Haus. Geöffnet täglich außer Montag.</p>"""


# The leaked answer of the contamination fixtures (flowllm/tools/web/guard.py, flowllm/export/contamination.py).
LEAKED_ANSWER = "Odile Marchetti"
LEAK_QUESTION = "Who was the glassblower who made the Orrin Vale chandelier?"
ANSWER_KEY = f"""<p>The validation split of a benchmark: each question with its final answer.</p>
<table class="dataset-viewer"><thead><tr><th>task_id</th><th>Question</th><th>Final answer</th></tr></thead><tbody>
<tr><td>leak-01</td><td>{LEAK_QUESTION}</td><td>{LEAKED_ANSWER}</td></tr>
<tr><td>leak-02</td><td>How many arches does the Vale viaduct have?</td><td>17</td></tr>
</tbody></table>"""
FORUM = f"""<p><b>Question:</b> does anyone know {LEAK_QUESTION[0].lower()}{LEAK_QUESTION[1:]} It is in a benchmark
I am working through.</p>
<p><b>Reply:</b> I looked it up in the answer file: the answer is {LEAKED_ANSWER}. She worked in the valley's
glass works until 1931.</p>"""


def long_article() -> str:
    """A long article: the one fact sits far past the first page a reader is shown."""
    filler = (
        "<p>Section {n}. Observations of the outer moons continued through the season, with the survey team "
        "recording positions every clear night and comparing them with the catalogue of the previous decade.</p>"
    )
    parts = [filler.format(n=n) for n in range(1, 120)]
    parts.insert(
        90,
        "<h2>Orbital elements</h2><p>The moon Tessaly has an orbital period of 17.42 days and an "
        "eccentricity of 0.031.</p>",
    )
    return "\n".join(parts)


def minimal_pdf(lines: list[str]) -> bytes:
    """A valid one-page PDF with the lines in Helvetica (no PDF library needed to serve one)."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    body = "BT /F1 12 Tf 72 720 Td 16 TL " + " ".join(f"({escape(line)}) Tj T*" for line in lines) + " ET"
    stream = body.encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> "
        b"/Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, obj in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + obj + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


REPORT_LINES = [
    "Gull Island Heritage Trust - Annual Report 2023",
    "Total visitors: 48,213",
    "Museum opening days: 122",
    "Membership at year end: 1,907",
]


@dataclass(frozen=True)
class Page:
    path: str
    title: str
    snippet: str
    date: str | None
    html: str


PAGES: dict[str, Page] = {
    p.path: p
    for p in (
        Page(
            "/wiki/Harbor_Point_Lighthouse",
            "Harbor Point Lighthouse",
            "The Harbor Point Lighthouse is a granite lighthouse on Gull Island, first lit in 1871.",
            "2024-03-02",
            layout("Harbor Point Lighthouse", LIGHTHOUSE),
        ),
        Page(
            "/wiki/Meridian_River_bridges",
            "List of Meridian River bridges",
            "Suspension bridges of the Meridian River ranked by main span length.",
            "2023-11-18",
            layout("List of Meridian River bridges", BRIDGES),
        ),
        Page(
            "/wiki/Tessaly_survey",
            "Tessaly moon survey",
            "A season-long survey of the outer moons, including the orbital elements of Tessaly.",
            None,
            layout("Tessaly moon survey", long_article()),
        ),
        Page(
            "/de/cafe-mueller",
            "Café Müller (Altstadt)",
            "Geschichte des Café Müller, gegründet 1898 von Jürgen Weiß.",
            "2022-06-30",
            layout("Café Müller", CAFE, charset="windows-1252"),
        ),
        Page(
            "/datasets/gaia-benchmark/GAIA",
            "gaia-benchmark/GAIA · Datasets at Hugging Face",
            "Benchmark questions with their final answers, such as the Orrin Vale chandelier glassblower.",
            None,
            layout("gaia-benchmark/GAIA", ANSWER_KEY),
        ),
        Page(
            "/t/orrin-vale-chandelier",
            "Orrin Vale chandelier glassblower? - forum thread",
            "Who made the Orrin Vale chandelier? A reply names the glassblower.",
            "2025-02-11",
            layout("Orrin Vale chandelier glassblower?", FORUM),
        ),
    )
}
# The host each corpus entry is found at (by the start of its path; the rest: the encyclopedia).
HOSTS = {"/reports/": "reports", "/datasets/": "huggingface.co", "/t/": "forum"}

# The search corpus: the pages plus documents that are not HTML pages.
SEARCH_EXTRA = [
    (
        "/reports/heritage-trust-2023.pdf",
        "Gull Island Heritage Trust annual report 2023 (PDF)",
        "Visitor numbers, museum opening days and membership of the Gull Island Heritage Trust in 2023.",
        "2024-01-15",
    ),
]


def fixture_url(path: str, host: str = "encyclopedia") -> str:
    return f"http://{host}.{FIXTURE_DOMAIN}{path}"


@dataclass(frozen=True)
class Hit:
    title: str
    url: str
    snippet: str
    date: str | None


def rank(query: str, limit: int) -> list[Hit]:
    """Corpus entries sharing words with the query, most shared words first (ties: corpus order)."""
    words = set(re.findall(r"\w+", query.lower()))
    entries = [(p.path, p.title, p.snippet, p.date) for p in PAGES.values()] + SEARCH_EXTRA
    scored = []
    for order, (path, title, snippet, date) in enumerate(entries):
        score = len(words & set(re.findall(r"\w+", f"{title} {snippet}".lower())))
        if score:
            host = next((h for start, h in HOSTS.items() if path.startswith(start)), "encyclopedia")
            scored.append((-score, order, Hit(title, fixture_url(path, host), snippet, date)))
    return [hit for _, _, hit in sorted(scored, key=lambda s: (s[0], s[1]))[: max(limit, 0)]]


def _key_ok(value: str | None) -> bool:
    """A key is accepted unless missing or spelled ``bad...`` (how tests send a key the service refuses)."""
    return bool(value) and not str(value).startswith("bad")


def _unauthorized(message: str) -> JSONResponse:
    return JSONResponse({"message": message, "statusCode": 401}, status_code=401)


async def serper(request: Request) -> Response:
    # POST https://google.serper.dev/search, X-API-KEY header, JSON {"q", "num"}; answers {"organic": [...]}.
    if not _key_ok(request.headers.get("x-api-key")):
        return _unauthorized("Unauthorized.")
    body = await request.json()
    hits = rank(str(body.get("q", "")), int(body.get("num", 10)))
    organic = [
        {"title": h.title, "link": h.url, "snippet": h.snippet, "position": n, **({"date": h.date} if h.date else {})}
        for n, h in enumerate(hits, start=1)
    ]
    return JSONResponse(
        {"searchParameters": {"q": body.get("q"), "type": "search", "engine": "google"}, "organic": organic}
    )


async def brave(request: Request) -> Response:
    # GET https://api.search.brave.com/res/v1/web/search?q=&count=, X-Subscription-Token header.
    if not _key_ok(request.headers.get("x-subscription-token")):
        return JSONResponse(
            {"type": "ErrorResponse", "error": {"code": "SUBSCRIPTION_TOKEN_INVALID", "status": 422}},
            status_code=422,
        )
    hits = rank(request.query_params.get("q", ""), int(request.query_params.get("count", "20")))
    results = [
        {"type": "search_result", "title": h.title, "url": h.url, "description": h.snippet, "page_age": h.date}
        for h in hits
    ]
    return JSONResponse(
        {
            "type": "search",
            "query": {"original": request.query_params.get("q")},
            "web": {"type": "search", "results": results},
        }
    )


async def tavily(request: Request) -> Response:
    # POST https://api.tavily.com/search, Authorization: Bearer tvly-..., JSON {"query", "max_results"}.
    auth = request.headers.get("authorization", "")
    if not auth.lower().startswith("bearer ") or not _key_ok(auth[7:].strip()):
        return _unauthorized("Unauthorized: missing or invalid API key.")
    body = await request.json()
    hits = rank(str(body.get("query", "")), int(body.get("max_results", 5)))
    results = [
        {"title": h.title, "url": h.url, "content": h.snippet, "score": round(1 - n / 10, 2), "published_date": h.date}
        for n, h in enumerate(hits)
    ]
    return JSONResponse({"query": body.get("query"), "results": results, "response_time": 0.01})


async def searxng(request: Request) -> Response:
    # GET <instance>/search?q=&format=json (an instance must enable the json format in its settings).
    if request.query_params.get("format") != "json":
        return Response("format not enabled", status_code=403)
    hits = rank(request.query_params.get("q", ""), 10)
    results = [
        {"url": h.url, "title": h.title, "content": h.snippet, "engine": "fixture", "publishedDate": h.date}
        for h in hits
    ]
    return JSONResponse({"query": request.query_params.get("q"), "number_of_results": len(results), "results": results})


async def page(request: Request) -> Response:
    found = PAGES.get(request.url.path)
    if found is None:
        return HTMLResponse(layout("Page not found", "<p>There is no page at this address.</p>"), status_code=404)
    if "windows-1252" in found.html[:200]:
        return Response(found.html.encode("cp1252"), media_type="text/html; charset=windows-1252")
    return HTMLResponse(found.html)


async def report_pdf(request: Request) -> Response:
    return Response(minimal_pdf(REPORT_LINES), media_type="application/pdf")


async def redirect(request: Request) -> Response:
    return RedirectResponse("/wiki/Meridian_River_bridges", status_code=302)


async def answer_key_redirect(request: Request) -> Response:
    return RedirectResponse(fixture_url("/datasets/gaia-benchmark/GAIA", "huggingface.co"), status_code=302)


async def redirect_loop(request: Request) -> Response:
    return RedirectResponse(f"/loop/{int(request.path_params['n']) + 1}", status_code=302)


async def server_error(request: Request) -> Response:
    return HTMLResponse("<h1>Internal Server Error</h1>", status_code=500)


async def slow(request: Request) -> Response:
    await asyncio.sleep(float(request.query_params.get("seconds", "3")))
    return HTMLResponse(layout("A slow page", "<p>This page took its time.</p>"))


async def endless(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"<html><body><p>This page never ends.</p>"
        while True:
            await asyncio.sleep(0.05)
            yield b"<p>more</p>" * 100

    return StreamingResponse(chunks(), media_type="text/html")


async def huge(request: Request) -> Response:
    paragraph = b"<p>" + b"Padding text that goes on and on. " * 30 + b"</p>\n"
    count = HUGE_PAGE_BYTES // len(paragraph)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"<html><body><h1>A very large page</h1><p>The first fact: the answer is 42.</p>\n"
        for start in range(0, count, 256):
            yield paragraph * min(256, count - start)

    return StreamingResponse(chunks(), media_type="text/html")


async def binary(request: Request) -> Response:
    return Response(bytes(range(256)) * 64, media_type="application/octet-stream")


def counting(app: Any, seen: collections.Counter[str]) -> Any:
    """An ASGI wrapper counting requests per path: how tests prove a cached run made no network call."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            seen[scope.get("path", "")] += 1
        await app(scope, receive, send)

    return asgi


def build_app() -> Starlette:
    routes = [
        Route("/serper/search", serper, methods=["POST"]),
        Route("/brave/res/v1/web/search", brave, methods=["GET"]),
        Route("/tavily/search", tavily, methods=["POST"]),
        Route("/searxng/search", searxng, methods=["GET"]),
        Route("/reports/heritage-trust-2023.pdf", report_pdf),
        Route("/go/longest-bridge", redirect),
        Route("/go/answer-key", answer_key_redirect),
        Route("/loop/{n:int}", redirect_loop),
        Route("/error", server_error),
        Route("/slow", slow),
        Route("/endless", endless),
        Route("/huge", huge),
        Route("/download.bin", binary),
        Route("/{path:path}", page),
    ]
    return Starlette(routes=routes)


class WebFixtures:
    """The fixture server on a free 127.0.0.1 port, served from a background thread with its own event loop."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # Requests per path, on the server's one event loop (read from tests after the calls returned).
        self.requests: collections.Counter[str] = collections.Counter()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> str:
        if self._thread is not None:
            return self.base_url
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            counting(build_app(), self.requests),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        self._server = server

        def run() -> None:
            try:
                asyncio.run(server.serve(sockets=[sock]))
            except BaseException as exc:  # reported to start() instead of dying silently in the thread
                self._error = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name=f"flowllm-web-fixtures-{self.port}", daemon=True)
        self._thread.start()
        waiter = threading.Event()
        for _ in range(int(timeout_s / 0.01)):
            if server.started or self._error is not None or not self._thread.is_alive():
                break
            waiter.wait(0.01)
        if not server.started:
            self.stop()
            raise RuntimeError(f"the web fixture server did not start on {self.host}: {self._error!r}")
        return self.base_url

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True  # endless pages never finish on their own
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread = None
        self._server = None

    def __enter__(self) -> WebFixtures:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
