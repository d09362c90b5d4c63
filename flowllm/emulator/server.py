"""The loopback emulator: a Starlette app speaking three wire protocols, run by uvicorn in a background
thread.

    with Emulator("script.yaml") as emu:          # or: base = emu.start(); ...; emu.stop()
        AsyncAnthropic(base_url=emu.base_url, api_key="x")  # POST /v1/messages
        AsyncOpenAI(base_url=emu.openai_base_url, api_key="x")  # POST /v1/chat/completions, /v1/responses

Each reply is made from the request body and the ``X-Flowllm-Task`` header alone, so concurrent tasks and
reruns see identical replies; only the usage's cache counts depend on what was sent before (prompt_cache.py).
The request log (``Emulator.requests``) keeps what tests need to check routing (path, task, agent, auth
scheme, status), never a key.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from flowllm.emulator import anthropic_wire, media, openai_chat_wire, openai_responses_wire
from flowllm.emulator.batches import AnthropicBatches, OpenAIBatches
from flowllm.emulator.common import CacheUsage, ParsedRequest, Plan, RequestError, plan_reply, request_image_digests
from flowllm.emulator.faults import Draw, FaultPlan, FaultRule, RequestThrottle
from flowllm.emulator.prompt_cache import Clock, PromptCache, cache_owner
from flowllm.emulator.script import Reply, Script

CAPTURE_ENV = "FLOWLLM_EMULATOR_CAPTURE"
SSEEvent = tuple[str | None, Any]  # (event name or None, data dict or the literal "[DONE]")


@dataclass(frozen=True)
class WireProtocol:
    name: str
    path: str
    call_prefix: str
    module: ModuleType
    reply_json: Callable[[Plan, ParsedRequest], dict[str, Any]]
    reply_events: Callable[[Plan, ParsedRequest], list[SSEEvent]]


PROTOCOLS: dict[str, WireProtocol] = {
    "anthropic": WireProtocol(
        "anthropic",
        "/v1/messages",
        "toolu_",
        anthropic_wire,
        anthropic_wire.message_json,
        anthropic_wire.message_events,
    ),
    "openai_chat": WireProtocol(
        "openai_chat",
        "/v1/chat/completions",
        "call_",
        openai_chat_wire,
        openai_chat_wire.completion_json,
        openai_chat_wire.completion_events,
    ),
    "openai_responses": WireProtocol(
        "openai_responses",
        "/v1/responses",
        "call_",
        openai_responses_wire,
        openai_responses_wire.response_json,
        openai_responses_wire.response_events,
    ),
}


@dataclass(frozen=True)
class RequestRecord:
    protocol: str
    task_id: str | None
    agent: str | None
    auth: str  # "bearer" | "x-api-key" | "none" | "both"
    turn: int | None
    status: int
    stream: bool
    fault: str | None = None  # the injected fault ("status:429", "reset", ...), None for a normal answer
    attempt: int | None = None  # the n-th request for this (task, agent, turn)


def _script_turn(request: Request, counted: int) -> int:
    """The agent's own turn number when the client sends it: counting assistant messages goes wrong once a
    history was compacted or trimmed of whole turns."""
    value = request.headers.get("x-flowllm-turn", "")
    return int(value) if value.isdigit() and int(value) > 0 else counted


def _auth_scheme(request: Request) -> str:
    bearer = request.headers.get("authorization", "").lower().startswith("bearer ")
    api_key = bool(request.headers.get("x-api-key"))
    if bearer and api_key:
        return "both"
    return "bearer" if bearer else ("x-api-key" if api_key else "none")


def _api_key(request: Request) -> str | None:
    """The key the client sent (only to match a fault rule's ``api_keys``; never logged)."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


TRANSPORT_SCOPE_KEY = "flowllm.transport"


def _expose_transport(app: Any) -> Any:
    """An ASGI wrapper that puts the connection's transport in the scope, so a ``reset`` fault can drop the
    connection without any response (uvicorn's ``send`` is a method of its request cycle, which holds it)."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            scope[TRANSPORT_SCOPE_KEY] = getattr(getattr(send, "__self__", None), "transport", None)
        await app(scope, receive, send)

    return asgi


def _stream_error_event(protocol: str, rule: FaultRule, sequence: int) -> SSEEvent:
    etype = rule.error_type or "overloaded_error"
    message = rule.message or f"injected fault: {etype} in the middle of the stream"
    if protocol == "anthropic":
        return ("error", {"type": "error", "error": {"type": etype, "message": message}})
    if protocol == "openai_responses":
        return (
            "error",
            {"type": "error", "code": etype, "message": message, "param": None, "sequence_number": sequence},
        )
    # Chat Completions servers send an error object as a data line (the SDK raises on a top-level "error").
    return (None, {"error": {"message": message, "type": etype, "param": None, "code": rule.code}})


def _sse_bytes(events: list[SSEEvent]) -> list[bytes]:
    out = []
    for name, data in events:
        payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        head = f"event: {name}\n" if name else ""
        out.append(f"{head}data: {payload}\n\n".encode())
    return out


class EmulatorApp:
    """The request handling, separate from the thread and server plumbing so tests can drive it directly."""

    def __init__(
        self,
        script: Script,
        *,
        faults: FaultPlan | None = None,
        log_size: int = 1000,
        batch_routes: Mapping[str, Sequence[Any]] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.script = script
        # What every answered request read from and wrote to the providers' prompt caches (one per API key).
        self.cache = PromptCache(clock)
        # $FLOWLLM_EMULATOR_CAPTURE: a file every request body is appended to, one JSON line each with its task
        # (what a client really sent, before any masking: how the tests prove no key reaches a request).
        capture = os.environ.get(CAPTURE_ENV)
        self.capture = Path(capture) if capture else None
        self.faults = faults if faults is not None else FaultPlan.parse(script.faults)
        self.requests: collections.deque[RequestRecord] = collections.deque(maxlen=log_size)
        # Requests seen per (task, agent, turn): the attempt number fault rules can be scheduled on. The
        # handlers run on the emulator's one event loop, so this needs no lock.
        self.attempts: collections.Counter[tuple[str | None, str | None, int]] = collections.Counter()
        self.throttle = RequestThrottle(self.faults.rate_limit) if self.faults.rate_limit else None
        # Model requests being answered now, and the most at once since ``peak`` was last reset (a test's gauge).
        self.in_flight = 0
        self.peak = 0
        routes = [Route(p.path, self._endpoint(p), methods=["POST"]) for p in PROTOCOLS.values()]
        routes.append(Route("/health", self._health, methods=["GET"]))
        routes.extend(media.routes(script))  # /v1/audio/transcriptions (flowllm/emulator/media.py)
        # /v1/messages/batches (batches.py); batch_routes: the run's custom id -> (task, agent, turn)
        self.batches = AnthropicBatches(script, script.batches, batch_routes, cache=self.cache)
        self.openai_batches = OpenAIBatches(self.batches)  # /v1/files, /v1/batches (batches.py)
        routes[:0] = [*self.batches.routes(), *self.openai_batches.routes()]
        self.app = _expose_transport(Starlette(routes=routes))

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def _endpoint(self, proto: WireProtocol) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            return await self.handle(proto, request)

        return endpoint

    def _error(self, proto: WireProtocol, err: RequestError, request_id: str) -> Response:
        return JSONResponse(
            proto.module.error_body(err, request_id),
            status_code=err.status,
            headers={"request-id": request_id, "x-request-id": request_id},
        )

    def _capture_request(self, task_id: str | None, agent: str | None, raw: bytes) -> None:
        if self.capture is not None:
            line = json.dumps({"task": task_id, "agent": agent, "body": raw.decode("utf-8", "replace")})
            with self.capture.open("a", encoding="utf-8") as out:
                out.write(line + "\n")

    def _logger(
        self,
        proto: WireProtocol,
        request: Request,
        auth: str,
        parsed: ParsedRequest | None,
        attempt: int | None = None,
    ) -> Callable[[int, str | None], None]:
        """What records one answered request (its status and the fault injected, if any) in ``requests``."""
        task_id, agent = request.headers.get("x-flowllm-task"), request.headers.get("x-flowllm-agent")

        def log(status: int, fault: str | None = None) -> None:
            self.requests.append(
                RequestRecord(
                    proto.name,
                    task_id,
                    agent,
                    auth,
                    parsed.turn if parsed else None,
                    status,
                    bool(parsed and parsed.stream),
                    fault,
                    attempt,
                )
            )

        return log

    @staticmethod
    def _parse(proto: WireProtocol, auth: str, raw: bytes) -> ParsedRequest:
        """The request's key and body checked as the real API would; raises ``RequestError`` for a bad one."""
        if auth == "none":
            raise RequestError(
                "authentication required: send an API key",
                status=401,
                error_type="authentication_error",
                code="invalid_api_key",
            )
        if auth == "both":
            raise RequestError(
                "send the key once: either `x-api-key` or `Authorization`, not both",
                error_type="invalid_request_error",
            )
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise RequestError(f"There was an error parsing the body: {exc}") from exc
        parsed: ParsedRequest = proto.module.parse_request(body)
        return parsed

    def _reply(self, request: Request, parsed: ParsedRequest, rule: FaultRule | None) -> Reply:
        """The script's reply for this turn (an empty one for the ``empty`` fault)."""
        if rule is not None and rule.fault == "empty":
            return Reply("", None, None, (), "end_turn")
        return self.script.reply(
            self.script.key(
                request.headers.get("x-flowllm-task"),
                request.headers.get("x-flowllm-agent"),
                request.headers.get("x-flowllm-epoch"),
            ),
            _script_turn(request, parsed.turn),
            parsed.tool_results,
            tuple(request_image_digests(parsed.body)),
        )

    @staticmethod
    def _stream(
        proto: WireProtocol, plan: Plan, parsed: ParsedRequest, rule: FaultRule | None, headers: dict[str, str]
    ) -> Response:
        """The reply as server-sent events, cut short or broken as a ``truncate``, ``stream_error`` or
        ``malformed`` fault asks."""
        sse = proto.reply_events(plan, parsed)
        if rule is not None and rule.fault in ("truncate", "stream_error"):
            cut = len(sse) // 2 if rule.after_events is None else min(rule.after_events, len(sse) - 1)
            sse = sse[:cut]
            if rule.fault == "stream_error":
                sse.append(_stream_error_event(proto.name, rule, cut))
        events = _sse_bytes(sse)
        if rule is not None and rule.fault == "malformed":
            middle = len(events) // 2
            events[middle] = events[middle][: max(len(events[middle]) // 2, 8)].rstrip(b"\n") + b"\n\n"

        async def body_iter() -> AsyncIterator[bytes]:
            for chunk in events:
                yield chunk

        return StreamingResponse(
            body_iter(), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"}
        )

    async def handle(self, proto: WireProtocol, request: Request) -> Response:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await self._handle(proto, request)
        finally:
            self.in_flight -= 1

    async def _handle(self, proto: WireProtocol, request: Request) -> Response:
        try:
            raw = await request.body()
        except ClientDisconnect:
            # The client went away mid-request (a run interrupted with Ctrl-C): nobody reads an answer, and a
            # traceback in the run's log would be noise about a normal stop.
            return Response(status_code=499)
        request_id = "req_" + hashlib.sha256(raw).hexdigest()[:24]
        task_id = request.headers.get("x-flowllm-task")
        agent = request.headers.get("x-flowllm-agent")
        self._capture_request(task_id, agent, raw)
        auth = _auth_scheme(request)
        try:
            parsed = self._parse(proto, auth, raw)
        except RequestError as err:
            self._logger(proto, request, auth, None)(err.status, None)
            return self._error(proto, err, request_id)
        if self.throttle is not None and (wait := self.throttle.take()) > 0:  # the server's own quota
            over = FaultRule(
                "status", status=429, retry_after_s=wait, message="rate limit exceeded (requests per minute)"
            )
            throttled = self._logger(proto, request, auth, parsed)
            return await self._fault_response(proto, request, over, request_id, throttled)
        self.attempts[(task_id, agent, parsed.turn)] += 1
        attempt = self.attempts[(task_id, agent, parsed.turn)]
        log = self._logger(proto, request, auth, parsed, attempt)
        rule = self.faults.pick(
            Draw(task_id, agent, parsed.turn, attempt, proto.name, parsed.stream, _api_key(request))
        )
        headers = {"request-id": request_id, "x-request-id": request_id}
        if rule is not None and rule.fault == "delay":
            await asyncio.sleep(rule.delay_s)  # then answer normally: late, not wrong
        elif rule is not None and rule.fault not in ("truncate", "stream_error", "malformed", "empty"):
            return await self._fault_response(proto, request, rule, request_id, log)
        try:
            cache = self._cache_usage(proto, request, parsed)
        except RequestError as err:
            log(err.status, None)
            return self._error(proto, err, request_id)
        plan = plan_reply(parsed, self._reply(request, parsed, rule), call_prefix=proto.call_prefix, cache=cache)
        log(200, _fault_name(rule))
        if parsed.stream:
            return self._stream(proto, plan, parsed, rule, headers)
        if rule is not None and rule.fault == "malformed":
            text = json.dumps(proto.reply_json(plan, parsed), ensure_ascii=False)
            return Response(text[: len(text) // 2], media_type="application/json", headers=headers)
        return JSONResponse(proto.reply_json(plan, parsed), headers=headers)

    def _cache_usage(self, proto: WireProtocol, request: Request, parsed: ParsedRequest) -> CacheUsage:
        """What the prompt reads from and writes to the cache of the key that sent it (prompt_cache.py).

        Whose cache: ``cache_owner`` (one per key, task and agent)."""
        organisation = cache_owner(
            _api_key(request) or "",
            request.headers.get("x-flowllm-task", ""),
            request.headers.get("x-flowllm-agent", ""),
        )
        if proto.name == "anthropic":
            return self.cache.anthropic(organisation, parsed.model, parsed.units)
        return self.cache.openai(organisation, parsed.body, parsed.units)

    async def _fault_response(
        self,
        proto: WireProtocol,
        request: Request,
        rule: FaultRule,
        request_id: str,
        log: Callable[[int, str | None], None],
    ) -> Response:
        if rule.fault == "reset":
            log(0, "reset")
            transport = request.scope.get(TRANSPORT_SCOPE_KEY)
            if transport is not None:
                transport.abort()  # the client sees the connection drop before any response byte
                await asyncio.sleep(0)  # let uvicorn notice, so it does not write to the dead socket
                return Response(status_code=500)

            async def broken() -> AsyncIterator[bytes]:
                raise ConnectionResetError("injected reset")
                yield b""  # pragma: no cover - makes this an async generator

            return StreamingResponse(broken(), media_type="application/json")
        err = RequestError(
            rule.message_for(),
            status=rule.status,
            error_type=rule.error_type_for(),
            code=rule.code,
        )
        log(rule.status, _fault_name(rule))
        return JSONResponse(
            proto.module.error_body(err, request_id),
            status_code=rule.status,
            headers={"request-id": request_id, "x-request-id": request_id, **rule.headers()},
        )


def _fault_name(rule: FaultRule | None) -> str | None:
    if rule is None:
        return None
    return f"status:{rule.status}" if rule.fault == "status" else rule.fault


class Emulator:
    """The emulator on a free 127.0.0.1 port, served from a background thread with its own event loop."""

    def __init__(
        self,
        script: str | Path | dict[str, Any] | Script,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: FaultPlan | None = None,
        batch_routes: Mapping[str, Sequence[Any]] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.script = script if isinstance(script, Script) else Script.load(script)
        self.host = host
        self.port = port
        self._app = EmulatorApp(self.script, faults=faults, batch_routes=batch_routes, clock=clock)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def requests(self) -> collections.deque[RequestRecord]:
        return self._app.requests

    @property
    def faults(self) -> FaultPlan:
        return self._app.faults

    @property
    def app(self) -> EmulatorApp:
        """The request handling: its ``in_flight`` and ``peak`` gauges, ``attempts`` counter."""
        return self._app

    @property
    def throttle(self) -> RequestThrottle | None:
        """The server's rate limit (``faults.rate_limit``): its admitted and throttled counts."""
        return self._app.throttle

    @property
    def base_url(self) -> str:
        """The root URL; the Anthropic SDK appends ``/v1/messages`` to it."""
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """The OpenAI SDK wants the ``/v1`` prefix in its base URL."""
        return self.base_url + "/v1"

    def start(self, timeout_s: float = 10.0) -> str:
        if self._thread is not None:
            return self.base_url
        # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted connections whose listening socket
        # says proto=IPPROTO_TCP; with the default proto=0, Nagle and delayed ACKs cost ~45 ms per request.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))  # port 0: the kernel picks a free port, no race with other runs
        # A run of thousands of tasks opens thousands of connections at once: past a backlog of 128 the kernel
        # drops the attempts, the SDKs see connection errors and the breaker opens on a healthy emulator.
        sock.listen(4096)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
            # uvicorn's 5 s would close a pooled connection under a task busy with its tools for longer: the
            # client's next request races the close, and the run would count reconnects as faults.
            timeout_keep_alive=600,
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

        self._thread = threading.Thread(target=run, name=f"flowllm-emulator-{self.port}", daemon=True)
        self._thread.start()
        ready = threading.Event()
        for _ in range(int(timeout_s / 0.01)):
            if server.started or self._error is not None or not self._thread.is_alive():
                break
            ready.wait(0.01)
        if not server.started:
            self.stop()
            raise RuntimeError(f"the emulator did not start on {self.host}: {self._error!r}")
        return self.base_url

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread = None
        self._server = None

    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
