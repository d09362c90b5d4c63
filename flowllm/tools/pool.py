"""The per-task tool pool: MCP servers over stdio, started together, called safely, stopped without orphans.

``open_tool_pool(cfg, workspace)`` starts every configured server (concurrently: each costs about a second of
imports), asks each for its tools, and yields a ``ToolPool``, a ``flowllm.core.interfaces.ToolBackend``.
Leaving the context, normally, on an error or on cancellation, stops every server process and its group.

What ``ToolPool.call`` promises, because a tool is where an agent touches the world and must never hang or
kill the run:

* It never raises for a tool-side problem. An unknown server or tool, arguments that fail the tool's input
  schema, a timeout, a server that crashed, a protocol error: each becomes
  ``ToolResult(is_error=True, content="Error: <what happened and what to do>")``. Only
  ``asyncio.CancelledError`` (and programming errors of the caller) propagate.
* A wrong or missing server name is corrected when exactly one server offers the tool.
* A server that died before answering is restarted once and the call retried; a second death is reported.
  Restarts are shared: three calls that saw the same crash cause one restart.
* A call that times out is abandoned (the server is told to cancel it); the server is then pinged in the
  background and restarted if it stopped answering, so one hung tool cannot wedge the next calls.
* Results longer than ``max_result_chars`` are cut with a note saying how much was cut, and the workspace's
  absolute path is replaced by ``.`` in every result, so runs in different folders compare file by file.

Each server's connection lives in its own asyncio task (``_Connection``): the SDK's ``stdio_client`` and
``ClientSession`` are anyio context managers that must be entered and left by the same task, while calls come
from whichever task the runner uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

import flowllm
from flowllm.config.schema import ToolsConfig
from flowllm.core.types import Block, ToolResult, ToolSpec
from flowllm.tools.common import WORKSPACE_ENV, scrub_workspace, workspace_spellings
from flowllm.tools.state import STATE_META_KEY, TaskState, result_state_update, tool_asks_for_state
from flowllm.tools.validation import describe_signature, validate_arguments

log = logging.getLogger(__name__)

DEFAULT_START_TIMEOUT_S = 30.0
PING_TIMEOUT_S = 5.0
MAX_RESTARTS = 3  # per server and pool: a server that keeps dying is given up on
STDERR_TAIL_CHARS = 1500
_PYTHON_COMMANDS = {"python", "python3", "${python}"}


# --------------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class ServerSpec:
    """One server entry of a ``conf/tools/*.yaml`` file, normalised."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0
    blacklist: frozenset[str] = frozenset()
    requires_env: tuple[str, ...] = ()

    @property
    def uses_our_python(self) -> bool:
        return self.command in _PYTHON_COMMANDS

    def executable(self) -> str:
        # 'python' means the interpreter running flowllm, so a virtualenv's packages are there for the server.
        return sys.executable if self.uses_our_python else self.command

    def missing_env(self, environ: Mapping[str, str] | None = None) -> list[str]:
        environ = os.environ if environ is None else environ
        return [var for var in self.requires_env if not environ.get(var)]


@dataclass(frozen=True)
class PoolSettings:
    servers: tuple[ServerSpec, ...]
    call_timeout_s: float = 60.0
    max_result_chars: int = 20000
    scope: str = "task"


def _plain(cfg: Any) -> Any:
    """A DictConfig, a dataclass or a mapping, as plain Python containers (interpolations resolved)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, DictConfig | ListConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    if hasattr(cfg, "__dataclass_fields__"):
        return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    return cfg


def load_settings(cfg: ToolsConfig | Mapping[str, Any] | Any) -> PoolSettings:
    """Normalise a ``ToolsConfig`` (dataclass, DictConfig or plain mapping) into ``PoolSettings``."""
    data = _plain(cfg)
    if not isinstance(data, Mapping):
        raise TypeError(f"tools config must be a mapping, got {type(cfg).__name__}")
    servers: list[ServerSpec] = []
    for name, entry in (data.get("servers") or {}).items():
        entry = _plain(entry)
        if not isinstance(entry, Mapping) or not entry.get("command"):
            raise ValueError(f"tools.servers.{name}: a server needs a 'command'")
        servers.append(
            ServerSpec(
                name=str(name),
                command=str(entry["command"]),
                args=tuple(str(a) for a in entry.get("args") or ()),
                env={str(k): str(v) for k, v in (entry.get("env") or {}).items()},
                timeout_s=float(entry.get("timeout_s", 60.0)),
                blacklist=frozenset(str(t) for t in entry.get("blacklist") or ()),
                requires_env=tuple(str(v) for v in entry.get("requires_env") or ()),
            )
        )
    return PoolSettings(
        servers=tuple(servers),
        call_timeout_s=float(data.get("call_timeout_s", 60.0)),
        max_result_chars=int(data.get("max_result_chars", 20000)),
        scope=str(data.get("scope", "task")),
    )


def _server_env(spec: ServerSpec, workspace: Path) -> dict[str, str]:
    """The environment a server gets on top of the SDK's minimal default (HOME, PATH, ...)."""
    env = dict(spec.env)
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


# ------------------------------------------------------------------------------------------------- errors


class _ServerFailure(Exception):
    """A call could not get an answer from the server; the message is for the model."""


def _describe_exception(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe_exception(e) for e in exc.exceptions)
    if isinstance(exc, MCPError):
        return exc.message
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_connection_loss(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_connection_loss(e) for e in exc.exceptions)
    if isinstance(exc, MCPError):
        return exc.code == types.CONNECTION_CLOSED
    return isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream | OSError)


# -------------------------------------------------------------------------------------------- connections


class _Connection:
    """One running server process and its MCP session, owned by a dedicated task."""

    def __init__(self, spec: ServerSpec, params: StdioServerParameters, errlog: TextIO) -> None:
        self.spec = spec
        self.params = params
        self.errlog = errlog
        self.session: ClientSession | None = None
        self.tools: list[types.Tool] = []
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
            raise _ServerFailure(f"did not finish starting within {timeout_s:g} s") from None
        except BaseException:
            await self.close()
            raise

    async def _run(self) -> None:
        assert self._ready is not None
        try:
            async with stdio_client(self.params, errlog=self.errlog) as (read, write):
                client_info = types.Implementation(name="flowllm", version=flowllm.__version__)
                async with ClientSession(read, write, client_info=client_info) as session:
                    await session.initialize()
                    self.tools = await _list_all_tools(session)
                    self.session = session
                    self._ready.set_result(None)
                    await self._stop.wait()
        except asyncio.CancelledError:
            if not self._ready.done():
                self._ready.cancel()
            raise
        except Exception as exc:  # including anyio's ExceptionGroups: a failed start or a broken connection
            if not self._ready.done():
                self._ready.set_exception(_ServerFailure(_describe_exception(exc)))
            else:
                log.debug("tool server %s: connection ended: %s", self.spec.name, _describe_exception(exc))
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


async def _list_all_tools(session: ClientSession) -> list[types.Tool]:
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


class _ServerHandle:
    """A configured server across restarts: state, tools, the live connection, the shared restart."""

    def __init__(self, spec: ServerSpec, workspace: Path, start_timeout_s: float, ping_timeout_s: float) -> None:
        self.spec = spec
        self.workspace = workspace
        self.start_timeout_s = start_timeout_s
        self.ping_timeout_s = ping_timeout_s
        self.tools: dict[str, types.Tool] = {}
        self.problem: str | None = None  # why the server is unavailable (disabled or failed)
        self.conn: _Connection | None = None
        self.generation = 0
        self.restarts = 0
        self._restart_task: asyncio.Task[None] | None = None
        self._errlog: TextIO | None = None
        self._closed = False
        self._start_lock = asyncio.Lock()

    # -- lifecycle

    async def ensure_started(self) -> None:
        """Start a lazily opened server on its first call; concurrent first calls share one start."""
        if self.generation > 0:
            return
        async with self._start_lock:
            if self.generation == 0:
                if self._closed:
                    raise _ServerFailure("the tool pool is closed")
                if self.problem is not None:
                    raise _ServerFailure(self.problem)
                await self.start()

    def _params(self) -> StdioServerParameters:
        return StdioServerParameters(
            command=self.spec.executable(),
            args=list(self.spec.args),
            env=_server_env(self.spec, self.workspace),
            encoding_error_handler="replace",
        )

    async def start(self) -> None:
        if self._errlog is None:
            # The server's stderr goes to a private file: out of our console, and its tail explains a crash.
            self._errlog = tempfile.TemporaryFile(  # noqa: SIM115 - lives as long as the server; closed in close()
                mode="w+", encoding="utf-8", errors="replace"
            )
        conn = _Connection(self.spec, self._params(), self._errlog)
        try:
            await conn.open(self.start_timeout_s)
        except _ServerFailure as exc:
            self.problem = self._with_stderr(f"server '{self.spec.name}' failed to start: {exc}")
            raise _ServerFailure(self.problem) from None
        self.conn = conn
        self.generation += 1
        self.tools = {t.name: t for t in conn.tools}
        self.problem = None

    async def restart(self, seen_generation: int) -> None:
        """Restart once per crash, however many calls noticed it; callers wait on the same attempt."""
        if self._closed:
            raise _ServerFailure("the tool pool is closed")
        if self.generation != seen_generation and self.conn is not None and not self.conn.lost:
            return  # someone else already restarted it
        if self._restart_task is None or self._restart_task.done():
            if self.restarts >= MAX_RESTARTS:
                raise _ServerFailure(
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
        log.warning("tool server %s stopped; restarting it (restart %d)", self.spec.name, self.restarts)
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
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> types.CallToolResult:
        """Call with one restart-and-retry if the server is gone; raise ``_ServerFailure`` otherwise."""
        for attempt in range(2):
            conn, generation = self.conn, self.generation
            if conn is None or conn.session is None or conn.lost:
                await self.restart(generation)
                continue
            try:
                result = await conn.session.call_tool(name, arguments, meta=meta)  # type: ignore[arg-type]
            except MCPError as exc:
                if exc.code != types.CONNECTION_CLOSED:
                    raise _ServerFailure(f"the server answered with a protocol error: {exc.message}") from None
            except Exception as exc:
                if not _is_connection_loss(exc):
                    raise _ServerFailure(f"the call failed: {_describe_exception(exc)}") from None
            else:
                if isinstance(result, types.CallToolResult):
                    return result
                raise _ServerFailure("the server asked for input mid-call, which flowllm tools do not support")
            # The connection is gone: the process died (or closed its pipes) before answering.
            conn.lost = True
            if attempt == 0:
                await self.restart(generation)
        raise _ServerFailure(
            self._with_stderr(
                f"server '{self.spec.name}' stopped while running '{name}', again after a restart; "
                "the tool probably crashes on these arguments"
            )
        )

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
            with contextlib.suppress(_ServerFailure):
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
        return scrub_workspace(text[-limit:], self.workspace)


# ----------------------------------------------------------------------------------------------- the pool


def _error(call_id: str, server: str | None, name: str, message: str) -> ToolResult:
    return ToolResult(call_id=call_id, server=server, name=name, content=f"Error: {message}", is_error=True)


def truncate_text(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` characters with a note saying how much was cut (no cut when it fits)."""
    if limit <= 0 or len(text) <= limit:
        return text
    cut = len(text) - limit
    return f"{text[:limit]}\n[... {cut:,} of {len(text):,} characters cut: the result was longer than {limit:,}]"


def convert_result(result: types.CallToolResult) -> tuple[str, list[Block]]:
    """An MCP result's content as (text, image blocks)."""
    texts: list[str] = []
    images: list[Block] = []
    for item in result.content:
        if isinstance(item, types.TextContent):
            texts.append(item.text)
        elif isinstance(item, types.ImageContent):
            images.append({"type": "image", "media_type": item.mime_type, "data": item.data})
        elif isinstance(item, types.EmbeddedResource):
            res = item.resource
            if isinstance(res, types.TextResourceContents):
                texts.append(res.text)
            else:
                texts.append(f"[binary resource {res.uri} ({res.mime_type or 'unknown type'}) not shown]")
        elif isinstance(item, types.ResourceLink):
            texts.append(f"[resource link: {item.uri}]")
        elif isinstance(item, types.AudioContent):
            texts.append(f"[audio ({item.mime_type}) not shown]")
    if not texts and not images and result.structured_content is not None:
        import json

        texts.append(json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True))
    return "\n".join(texts), images


@dataclass(frozen=True)
class ToolCatalog:
    """What the configured servers offer, listed once per run (``discover_tools``).

    Starting an MCP server costs about a second of CPU (importing ``mcp``). With a catalog, a task's pool lists
    tools from it and starts a server only when the task first calls one of its tools: a task that uses one
    server of three pays for one. Tool schemas must not depend on the workspace (true for the built-in servers).
    """

    tools: dict[str, dict[str, types.Tool]] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)


async def discover_tools(
    cfg: ToolsConfig | Mapping[str, Any] | Any, workspace: Path, *, start_timeout_s: float = DEFAULT_START_TIMEOUT_S
) -> ToolCatalog:
    """Start every server once (in ``workspace``), record its tools, stop it."""
    async with open_tool_pool(cfg, workspace, start_timeout_s=start_timeout_s) as pool:
        return ToolCatalog(
            tools={name: dict(h.tools) for name, h in pool._handles.items() if h.tools},
            unavailable=pool.unavailable,
        )


class ToolPool:
    """The tools of one task: implements ``flowllm.core.interfaces.ToolBackend``. Build it with
    ``open_tool_pool``."""

    def __init__(
        self,
        settings: PoolSettings,
        workspace: Path,
        *,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        ping_timeout_s: float = PING_TIMEOUT_S,
        catalog: ToolCatalog | None = None,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.workspace = Path(workspace).resolve()
        self._spellings = workspace_spellings(self.workspace)
        self._handles: dict[str, _ServerHandle] = {}
        self._unavailable: dict[str, str] = {}  # server -> why (disabled for a missing key, failed to start)
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False
        self._task_state: TaskState | None = None
        for spec in settings.servers:
            missing = spec.missing_env()
            if missing:
                reason = f"server '{spec.name}' is disabled: environment variable(s) {', '.join(missing)} not set"
                log.warning("%s; its tools are not offered", reason)
                self._unavailable[spec.name] = reason
                continue
            handle = _ServerHandle(spec, self.workspace, start_timeout_s, ping_timeout_s)
            if catalog is not None:
                if spec.name in catalog.unavailable:
                    self._unavailable[spec.name] = catalog.unavailable[spec.name]
                    continue
                handle.tools = dict(catalog.tools.get(spec.name, {}))
            self._handles[spec.name] = handle

    async def start(self) -> None:
        """Start every enabled server concurrently; a server that fails is logged and left out.

        With a catalog nothing starts here: each server starts on its first call.
        """
        if self.catalog is not None:
            return

        async def start_one(handle: _ServerHandle) -> None:
            try:
                await handle.start()
            except _ServerFailure as exc:
                log.warning("%s", exc)
                self._unavailable[handle.spec.name] = str(exc)

        await asyncio.gather(*(start_one(h) for h in self._handles.values()))

    @property
    def unavailable(self) -> dict[str, str]:
        """Servers that are configured but not usable, with the reason (for logs and the run summary)."""
        return dict(self._unavailable)

    def _live(self) -> Iterable[_ServerHandle]:
        # Servers that answered list_tools at least once (a failed start leaves no tools).
        return (h for h in self._handles.values() if h.tools)

    async def list_tools(self) -> list[ToolSpec]:
        specs: list[ToolSpec] = []
        for handle in self._live():
            for tool in handle.tools.values():
                if tool.name in handle.spec.blacklist:
                    continue
                specs.append(
                    {
                        "server": handle.spec.name,
                        "name": tool.name,
                        "description": tool.description or tool.title or "",
                        "input_schema": dict(tool.input_schema or {"type": "object", "properties": {}}),
                    }
                )
        return specs

    def _route(self, server: str | None, name: str) -> _ServerHandle | str:
        """The handle serving ``server``/``name``, or the error message for the model."""
        handle = self._handles.get(server) if server else None
        if handle is not None and name in handle.tools:
            if name in handle.spec.blacklist:
                return f"tool '{name}' on server '{server}' is disabled in this configuration"
            return handle
        offering = [h for h in self._live() if name in h.tools and name not in h.spec.blacklist]
        if len(offering) == 1:
            return offering[0]  # a wrong or missing server name, corrected: only one server has this tool
        if len(offering) > 1:
            names = ", ".join(f"'{h.spec.name}'" for h in offering)
            return f"tool '{name}' is offered by several servers ({names}); name the server"
        if server in self._unavailable:
            return self._unavailable[server]
        if any(name in h.spec.blacklist for h in self._handles.values() if name in h.tools):
            return f"tool '{name}' is disabled in this configuration"
        available = "; ".join(
            f"{h.spec.name}: {', '.join(t for t in h.tools if t not in h.spec.blacklist)}" for h in self._live()
        )
        where = f" on server '{server}'" if server else ""
        return f"unknown tool '{name}'{where}. Available tools: {available or 'none'}"

    @property
    def task_state(self) -> TaskState:
        """The task's key-value store (flowllm/tools/state.py), next to the workspace; a new pool (a new attempt)
        starts it empty."""
        if self._task_state is None:
            self._task_state = TaskState.for_workspace(self.workspace, fresh=True)
        return self._task_state

    async def call(
        self,
        server: str | None,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str,
        timeout_s: float,
        state: TaskState | None = None,
    ) -> ToolResult:
        """Run one tool call; every tool-side problem comes back as an error result (see the module doc).

        ``state``: the task's store, handed only to tools that ask for it (their ``_meta``); their changes come
        back in the result and are applied to it."""
        if self._closed:
            return _error(call_id, server, name, "the tool pool is closed")
        routed = self._route(server, name)
        if isinstance(routed, str):
            return _error(call_id, server, name, routed)
        handle = routed
        server = handle.spec.name
        tool = handle.tools[name]
        problems = validate_arguments(arguments, dict(tool.input_schema or {}))
        if problems:
            signature = describe_signature(dict(tool.input_schema or {}))
            return _error(
                call_id,
                server,
                name,
                f"invalid arguments for {server}.{name}: {'; '.join(problems)}. Expected: {signature}",
            )
        try:
            await handle.ensure_started()
        except _ServerFailure as exc:
            return _error(call_id, server, name, scrub_workspace(str(exc), self._spellings))
        limits = [t for t in (timeout_s, handle.spec.timeout_s) if t and t > 0]
        limit = min(limits) if limits else None
        stateful = state is not None and tool_asks_for_state(tool)
        meta = {STATE_META_KEY: state.values(server)} if state is not None and stateful else None
        try:
            async with asyncio.timeout(limit):
                result = await handle.call_tool(name, arguments, meta)
        except TimeoutError:
            self._spawn(handle.check_health())
            return _error(
                call_id,
                server,
                name,
                f"{server}.{name} did not finish within {limit:g} s and was abandoned; "
                "try a smaller piece of work or different arguments",
            )
        except _ServerFailure as exc:
            return _error(call_id, server, name, scrub_workspace(str(exc), self._spellings))
        update = result_state_update(result) if stateful else None
        if state is not None and update:
            try:
                state.apply(server, update)
            except ValueError as exc:
                return _error(call_id, server, name, f"{server}.{name} sent an unusable state update: {exc}")
        text, images = convert_result(result)
        if not text and not images:
            text = "(the tool returned no content)"
        text = truncate_text(scrub_workspace(text, self._spellings), self.settings.max_result_chars)
        return ToolResult(
            call_id=call_id,
            server=server,
            name=name,
            content=text,
            is_error=bool(result.is_error),
            images=images,
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        """Stop every server (idempotent). Safe to call while the caller is being cancelled."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._background):
            task.cancel()
        closing = asyncio.gather(
            *(asyncio.shield(t) for t in self._background),
            *(h.close() for h in self._handles.values()),
            return_exceptions=True,
        )
        # Shielded so a second cancellation cannot interrupt the shutdown half-way: the servers still stop.
        await asyncio.shield(closing)

    def server_names(self) -> list[str]:
        return [spec.name for spec in self.settings.servers]


@asynccontextmanager
async def open_tool_pool(
    cfg: ToolsConfig | Mapping[str, Any] | Any,
    workspace: Path,
    *,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ping_timeout_s: float = PING_TIMEOUT_S,
    catalog: ToolCatalog | None = None,
) -> AsyncIterator[ToolPool]:
    """Start the servers of ``cfg`` for the task folder ``workspace``; stop them all on leaving the context.

    ``start_timeout_s`` bounds each server's start (spawn, handshake, tool listing); ``ping_timeout_s`` is how
    long a server may take to answer the health check that follows a timed-out call before it is restarted.
    """
    pool = ToolPool(
        load_settings(cfg),
        Path(workspace),
        start_timeout_s=start_timeout_s,
        ping_timeout_s=ping_timeout_s,
        catalog=catalog,
    )
    try:
        await pool.start()
        yield pool
    finally:
        await pool.aclose()
