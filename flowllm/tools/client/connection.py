"""One MCP server's connection and its restarts: stdio processes and remote servers alike.

``_Connection`` is one live session, owned by its own asyncio task: the SDK's transports and ``ClientSession``
are anyio context managers that must be entered and left by the same task, while calls come from whichever
task the runner uses. ``ServerHandle`` is a configured server across restarts: its tools, instructions, the
shared restart after a crash, the health check after a timeout, and the rule that a call is re-run after a
crash only when the tool says it is safe to (MCP annotations ``idempotentHint``/``readOnlyHint``, or
``retry_on_crash: true`` in the config).

The client side of the protocol lives here too (``ClientCallbacks``): roots (the task's folder, for task-scoped
servers), sampling answered through the task's ``Sampler`` when ``tools.sampling=answer`` (sampling.py) and
otherwise declined, elicitation declined, both with a message the server can pass on, ``tools/list_changed``
marking the tool list stale, progress notifications collected per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

import flowllm
from flowllm.tools.client.sampling import SAMPLING_DECLINED, Sampler
from flowllm.tools.client.settings import ServerSpec, Transport
from flowllm.tools.common import WORKSPACE_ENV, scrub_workspace
from flowllm.tools.needs import tool_limited, tool_withdrawn

log = logging.getLogger("flowllm.tools.client.pool")
# Logged once per restart of a tool server; the run's summary counts these lines ("what acted").
RESTART_MESSAGE = "tool server %s stopped; restarting it (restart %d)"

DEFAULT_START_TIMEOUT_S = 30.0
PING_TIMEOUT_S = 5.0
MAX_RESTARTS = 3  # per server and pool: a server that keeps dying is given up on
STDERR_TAIL_CHARS = 1500
ONE_LINE_CHARS = 300


class ServerFailure(Exception):
    """A call could not get an answer from the server; the message is for the model."""


class ProtocolFailure(ServerFailure):
    """The server answered a call with a protocol error (not a tool error)."""


class MaybeActed(ServerFailure):
    """The server died mid-call and the tool is not known to be safe to re-run."""


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def describe_exception(exc: BaseException) -> str:
    """One line for the model and the log: the innermost causes, no traceback."""
    seen: list[str] = []
    for leaf in _leaves(exc):
        if isinstance(leaf, MCPError):
            text = leaf.message
        elif isinstance(leaf, FileNotFoundError):
            text = f"command not found: {leaf.filename or leaf}"
        else:
            cause = leaf.__cause__ or leaf.__context__
            inner = cause if cause is not None and type(leaf).__name__ in {"ConnectError", "ReadError"} else leaf
            body = " ".join(str(inner).split())
            text = f"{type(inner).__name__}: {body}" if body else type(inner).__name__
        if text not in seen:
            seen.append(text)
    line = "; ".join(seen)
    return line if len(line) <= ONE_LINE_CHARS else line[: ONE_LINE_CHARS - 3] + "..."


def is_connection_loss(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(is_connection_loss(e) for e in exc.exceptions)
    if isinstance(exc, MCPError):
        return exc.code == types.CONNECTION_CLOSED
    return isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream | OSError)


def server_env(spec: ServerSpec, workspace: Path | None) -> dict[str, str]:
    """The environment a stdio server gets on top of the SDK's minimal default (HOME, PATH, ...)."""
    env = dict(spec.env)
    if workspace is not None:
        env[WORKSPACE_ENV] = str(workspace)
    for var in spec.requires_env:  # the key a server needs must reach it, or requiring it is pointless
        if os.environ.get(var):
            env.setdefault(var, os.environ[var])
    if spec.uses_our_python:
        # flowllm may run from a source checkout rather than an installed package: let `-m flowllm.tools.x`
        # find the same flowllm as this process.
        root = str(Path(flowllm.__file__).resolve().parent.parent)
        parts = [root, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root)]
        if env.get("PYTHONPATH"):
            parts.insert(0, env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


@dataclass
class ClientCallbacks:
    """What flowllm answers when a server asks something of the client."""

    roots: list[Path] = field(default_factory=list)  # empty: no roots capability is declared
    on_tools_changed: Any = None  # called (no arguments) on notifications/tools/list_changed
    server: str = ""
    # The task's sampler (tools.sampling=answer, task-scoped servers); None: declined with ``sampling_declined``.
    sampler: Sampler | None = None
    sampling_declined: str = SAMPLING_DECLINED

    async def list_roots(self, context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=p.resolve().as_uri(), name=p.name) for p in self.roots])  # type: ignore[arg-type]

    async def sampling(
        self, context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        if self.sampler is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message=self.sampling_declined)
        return await self.sampler.answer(self.server, params)

    async def elicitation(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        # Nobody sits at the keyboard during a run: declining lets the tool go on (or say what it needed).
        return types.ElicitResult(action="decline")

    async def messages(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification) and self.on_tools_changed is not None:
            self.on_tools_changed()


class _Connection:
    """One live session with a server (a process for stdio), owned by a dedicated task."""

    def __init__(self, spec: ServerSpec, workspace: Path | None, errlog: TextIO, callbacks: ClientCallbacks) -> None:
        self.spec = spec
        self.workspace = workspace
        self.errlog = errlog
        self.callbacks = callbacks
        self.session: ClientSession | None = None
        self.tools: list[types.Tool] = []
        self.instructions: str = ""
        self.resources = False
        self.lost = False  # set once a call saw the connection close
        self._ready: asyncio.Future[None] | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._task = asyncio.create_task(self._run(), name=f"flowllm-tool-server:{self.spec.name}")
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._ready)
        except TimeoutError:
            await self.close()
            raise ServerFailure(f"did not finish starting within {timeout_s:g} s") from None
        except BaseException:
            await self.close()
            raise

    @contextlib.asynccontextmanager
    async def _transport(self) -> Any:
        spec = self.spec
        if spec.transport is Transport.STDIO:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=spec.executable(),
                args=list(spec.args),
                env=server_env(spec, self.workspace),
                cwd=spec.cwd,
                encoding_error_handler="replace",
            )
            async with stdio_client(params, errlog=self.errlog) as streams:
                yield streams
        elif spec.transport is Transport.SSE:
            from mcp.client.sse import sse_client

            async with sse_client(spec.url, headers=spec.header_values()) as streams:
                yield streams
        else:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            async with (
                create_mcp_http_client(headers=spec.header_values()) as http,
                streamable_http_client(spec.url, http_client=http) as streams,
            ):
                yield streams[0], streams[1]

    async def _run(self) -> None:
        assert self._ready is not None
        cb = self.callbacks
        try:
            async with self._transport() as (read, write):
                client_info = types.Implementation(name="flowllm", version=flowllm.__version__)
                async with ClientSession(
                    read,
                    write,
                    client_info=client_info,
                    list_roots_callback=cb.list_roots if cb.roots else None,
                    sampling_callback=cb.sampling,
                    elicitation_callback=cb.elicitation,
                    message_handler=cb.messages,
                ) as session:
                    await session.initialize()
                    self.instructions = (session.instructions or "").strip()
                    self.tools = await list_all_tools(session)
                    self.resources = await _offers_resources(session)
                    self.session = session
                    self._ready.set_result(None)
                    await self._stop.wait()
        except asyncio.CancelledError:
            if not self._ready.done():
                self._ready.cancel()
            raise
        except Exception as exc:  # including anyio's ExceptionGroups: a failed start or a broken connection
            if not self._ready.done():
                self._ready.set_exception(ServerFailure(describe_exception(exc)))
            else:
                log.debug("tool server %s: connection ended: %s", self.spec.name, describe_exception(exc))
        finally:
            self.lost = True

    async def close(self) -> None:
        """Stop the server: close its stdin, then TERM/KILL its process group (the SDK's shutdown)."""
        task = self._task
        if task is None:
            return
        self._stop.set()
        if self._ready is not None and not self._ready.done():
            task.cancel()  # still starting: nothing to wind down politely
        # Shielded: if our caller is cancelled meanwhile, the owner task still finishes its bounded shutdown.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(task)
        if not task.done():  # we were cancelled while waiting: let the shutdown go on, but propagate
            raise asyncio.CancelledError


async def list_all_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever is a broken server, not a reason to hang
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        tools.extend(result.tools)
        cursor = result.next_cursor
        if not cursor:
            break
    return tools


async def _offers_resources(session: ClientSession) -> bool:
    """Whether the server has resources to read (declaring the capability with none listed is common)."""
    caps = session.server_capabilities
    if caps is None or caps.resources is None:
        return False
    try:
        if (await session.list_resources()).resources:
            return True
        return bool((await session.list_resource_templates()).resource_templates)
    except MCPError:
        return False


def safe_to_rerun(tool: types.Tool | None, spec: ServerSpec) -> bool:
    """Whether a call may be sent again after the server died mid-call: it cannot act twice."""
    if spec.retry_on_crash:
        return True
    hints = tool.annotations if tool is not None else None
    return bool(hints is not None and (hints.idempotent_hint or hints.read_only_hint))


class ServerHandle:
    """A configured server across restarts: state, tools, the live connection, the shared restart."""

    def __init__(
        self,
        spec: ServerSpec,
        workspace: Path | None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        ping_timeout_s: float = PING_TIMEOUT_S,
        *,
        sampler: Sampler | None = None,
        sampling_declined: str = SAMPLING_DECLINED,
    ) -> None:
        # A task-scoped server sees its task's folder (${workspace}, roots, $FLOWLLM_WORKSPACE); a run-scoped
        # one (workspace None) sees none.
        self.spec = spec.for_workspace(workspace) if workspace is not None else spec
        self.workspace = workspace
        # Who answers the server's sampling requests (None: they are declined with ``sampling_declined``).
        self.sampler = sampler
        self.sampling_declined = sampling_declined
        self.start_timeout_s = start_timeout_s
        self.ping_timeout_s = ping_timeout_s
        self.tools: dict[str, types.Tool] = {}
        self.instructions = ""
        self.resources = False  # the server declared resources: the pool offers read_resource
        self.tools_stale = False  # the server said its tool list changed
        self.problem: str | None = None  # why the server is unavailable (disabled or failed)
        self.withdrawn: dict[str, str] = {}  # tool -> why it cannot work here (its server says so): not offered
        self.limited: dict[str, str] = {}  # tool -> what part of it cannot work here: offered
        self.conn: _Connection | None = None
        self.generation = 0
        self.restarts = 0
        self.start_seconds = 0.0  # spent starting (and restarting) this server: start-up, not the calls' time
        self._restart_task: asyncio.Task[None] | None = None
        self._errlog: TextIO | None = None
        self._closed = False
        self._start_lock = asyncio.Lock()

    def _take_tools(self, tools: list[types.Tool]) -> None:
        """Keep the tools that can work; a tool its server marks as unable to work here is not offered, and the
        reasons are kept for the run's report (``flowllm.tools.needs``)."""
        self.withdrawn = {t.name: reason for t in tools if (reason := tool_withdrawn(t)) is not None}
        self.limited = {t.name: reason for t in tools if (reason := tool_limited(t)) is not None}
        self.tools = {t.name: t for t in tools if t.name not in self.withdrawn}

    def _mark_stale(self) -> None:
        self.tools_stale = True

    # -- lifecycle

    async def ensure_started(self) -> None:
        """Start a lazily opened server on its first call; concurrent first calls share one start."""
        if self.generation > 0:
            return
        async with self._start_lock:
            if self.generation == 0:
                if self._closed:
                    raise ServerFailure("the tool pool is closed")
                if self.problem is not None:
                    raise ServerFailure(self.problem)
                await self.start()

    async def start(self) -> None:
        spec = self.spec
        if self.workspace is not None:  # the task's folder is made by the first thing that needs it
            self.workspace.mkdir(parents=True, exist_ok=True)
        if spec.cwd and not Path(spec.cwd).is_dir():
            self.problem = f"server '{spec.name}' failed to start: its working directory {spec.cwd} does not exist"
            raise ServerFailure(self.problem)
        if self._errlog is None:
            # The server's stderr goes to a private file: out of our console, and its tail explains a crash.
            self._errlog = tempfile.TemporaryFile(  # noqa: SIM115 - lives as long as the server; closed in close()
                mode="w+", encoding="utf-8", errors="replace"
            )
        roots = [self.workspace] if self.workspace is not None else []
        callbacks = ClientCallbacks(roots, self._mark_stale, spec.name, self.sampler, self.sampling_declined)
        conn = _Connection(spec, self.workspace, self._errlog, callbacks)
        started = time.perf_counter()
        try:
            await conn.open(self.start_timeout_s)
        except ServerFailure as exc:
            self.start_seconds += time.perf_counter() - started
            where = f" at {spec.url}" if spec.remote else ""
            verb = "cannot be reached" if spec.remote else "failed to start"
            self.problem = self._with_stderr(f"server '{spec.name}'{where} {verb}: {exc}")
            raise ServerFailure(self.problem) from None
        self.start_seconds += time.perf_counter() - started
        self.conn = conn
        self.generation += 1
        self._take_tools(conn.tools)
        self.instructions = conn.instructions
        self.resources = conn.resources
        self.tools_stale = False
        self.problem = None

    async def refresh_tools(self) -> None:
        """Re-list after ``tools/list_changed``; the old list stays if the server cannot answer."""
        conn = self.conn
        if conn is None or conn.session is None or conn.lost:
            return
        self.tools_stale = False
        try:
            async with asyncio.timeout(self.ping_timeout_s):
                self._take_tools(await list_all_tools(conn.session))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("tool server %s: re-listing tools failed: %s", self.spec.name, describe_exception(exc))

    async def restart(self, seen_generation: int) -> None:
        """Restart once per crash, however many calls noticed it; callers wait on the same attempt."""
        if self._closed:
            raise ServerFailure("the tool pool is closed")
        if self.generation != seen_generation and self.conn is not None and not self.conn.lost:
            return  # someone else already restarted it
        if self._restart_task is None or self._restart_task.done():
            if self.restarts >= MAX_RESTARTS:
                raise ServerFailure(
                    f"server '{self.spec.name}' stopped {self.restarts + 1} times and is not restarted again"
                )
            self.restarts += 1
            self._restart_task = asyncio.create_task(self._do_restart(), name=f"restart:{self.spec.name}")
        # Shielded: a caller's own timeout must not abort a restart the other callers are waiting for.
        await asyncio.shield(self._restart_task)

    async def _do_restart(self) -> None:
        old, self.conn = self.conn, None
        if old is not None:
            await old.close()
        log.warning(RESTART_MESSAGE, self.spec.name, self.restarts)
        await self.start()

    async def close(self) -> None:
        self._closed = True
        if self._restart_task is not None and not self._restart_task.done():
            self._restart_task.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(self._restart_task)
        conn, self.conn = self.conn, None
        try:
            if conn is not None:
                await conn.close()
        finally:
            if self._errlog is not None:
                self._errlog.close()
                self._errlog = None

    # -- calls

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None = None,
        progress: list[dict[str, Any]] | None = None,
    ) -> types.CallToolResult:
        """Call; after a crash, restart and re-run only a tool that is safe to re-run. Raise ``ServerFailure``."""

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            if progress is not None:
                progress.append({"progress": value, "total": total, "message": message})

        for attempt in range(2):
            conn, generation = self.conn, self.generation
            if conn is None or conn.session is None or conn.lost:
                await self.restart(generation)
                continue
            try:
                result = await conn.session.call_tool(
                    name,
                    arguments,
                    progress_callback=on_progress,
                    meta=meta,  # type: ignore[call-overload]
                )
            except MCPError as exc:
                if exc.code != types.CONNECTION_CLOSED:
                    raise ProtocolFailure(f"the server answered with a protocol error: {exc.message}") from None
            except Exception as exc:
                if not is_connection_loss(exc):
                    raise ServerFailure(f"the call failed: {describe_exception(exc)}") from None
            else:
                if isinstance(result, types.CallToolResult):
                    return result
                raise ServerFailure("the server asked for input mid-call, which flowllm tools do not support")
            # The connection is gone: the process died (or closed its pipes) before answering.
            conn.lost = True
            if attempt == 0 and not safe_to_rerun(self.tools.get(name), self.spec):
                with contextlib.suppress(ServerFailure):
                    await self.restart(generation)  # for the next calls; this one is not sent again
                raise MaybeActed(
                    self._with_stderr(
                        f"server '{self.spec.name}' stopped while running '{name}': the tool may or may not have "
                        "acted. Check its effect before calling it again (it is not re-run automatically, "
                        "since it is not marked idempotent)"
                    )
                )
            if attempt == 0:
                await self.restart(generation)
        raise ServerFailure(
            self._with_stderr(
                f"server '{self.spec.name}' stopped while running '{name}', again after a restart; "
                "the tool probably crashes on these arguments"
            )
        )

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        conn = self.conn
        if conn is None or conn.session is None or conn.lost:
            await self.restart(self.generation)
            conn = self.conn
        assert conn is not None and conn.session is not None
        try:
            return await conn.session.read_resource(uri)
        except MCPError as exc:
            raise ServerFailure(f"reading {uri} failed: {exc.message}") from None
        except Exception as exc:
            raise ServerFailure(f"reading {uri} failed: {describe_exception(exc)}") from None

    async def check_health(self) -> None:
        """After a timeout: ping, and restart the server if it no longer answers (its event loop hangs)."""
        conn, generation = self.conn, self.generation
        if conn is None or conn.session is None or conn.lost:
            return
        try:
            async with asyncio.timeout(self.ping_timeout_s):
                await conn.session.send_ping()
        except asyncio.CancelledError:
            raise
        except Exception:
            conn.lost = True
            log.warning("tool server %s stopped answering after a timeout; restarting it", self.spec.name)
            with contextlib.suppress(ServerFailure):
                await self.restart(generation)

    def _with_stderr(self, message: str) -> str:
        tail = self.stderr_tail()
        return f"{message}. The server's error output ends with:\n{tail}" if tail else message

    def stderr_tail(self, limit: int = STDERR_TAIL_CHARS) -> str:
        if self._errlog is None:
            return ""
        try:
            fd = self._errlog.fileno()
            size = os.fstat(fd).st_size
            data = os.pread(fd, limit * 4, max(0, size - limit * 4))
        except (OSError, ValueError, AttributeError):
            return ""
        text = data.decode("utf-8", errors="replace").strip()
        return scrub_workspace(text[-limit:], self.workspace) if self.workspace is not None else text[-limit:]
