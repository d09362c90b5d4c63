"""The tools of a run and of each task: which servers run, for how long, and what a call promises.

``open_tool_catalog(cfg)`` runs once per run: it checks every configured server once (a disabled or failed
server is warned about once, and listed in ``unavailable`` for the run's summary), records each server's tools,
and keeps the ``scope: run`` servers connected for the whole run. ``open_tool_pool(cfg, workspace,
catalog=...)`` then gives one task a ``ToolPool`` (a ``flowllm.core.interfaces.ToolBackend``): task-scoped
servers start on the task's first call of one of their tools and stop with the task; run-scoped ones are
borrowed. Without a catalog, a pool starts every server itself (tests, benchmarks, one-off use).

With ``tools.sampling=answer`` a pool opens a ``Sampler`` (``pool.sampler``, sampling.py) for the servers it
starts; the task's agent binds the handler that answers their sampling requests. The run's shared servers
decline: their requests cannot be attributed to a task.

What ``ToolPool.call`` promises, because a tool is where an agent touches the world and must never hang or
kill the run:

* A call that fails for an infrastructure reason (the server unavailable, crashed or unreachable, a protocol
  error, or the server's own word: a library that failed to load, a sandbox that could not be set up) carries
  its ``ToolResult.infra`` cause, so the run counts it apart from the model's bad calls.
* It never raises for a tool-side problem. An unknown server or tool, arguments that fail the tool's input
  schema, a timeout, a server that crashed or cannot be reached, a protocol error: each becomes
  ``ToolResult(is_error=True, content="Error: <what happened and what to do>")``. Only
  ``asyncio.CancelledError`` (and programming errors of the caller) propagate.
* Routing (``routing.py``): a wrong server name is corrected only among running servers.
* A server that died mid-call is restarted (restarts shared); the call is re-run only for tools safe to re-run
  (``connection.py``); otherwise the model is told the tool may or may not have acted.
* A call that times out is abandoned (the server is told to cancel it); the server is then pinged in the
  background and restarted if it stopped answering, so one hung tool cannot wedge the next calls.
* Results longer than ``max_result_chars`` are cut with a note saying how much was cut, and the workspace's
  absolute path is replaced by ``.`` in every result, so runs in different folders compare file by file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types

from flowllm.config.schema import SamplingMode, ToolsConfig
from flowllm.core.interfaces import TaskStore
from flowllm.core.scratch import scratch as scratch_folder
from flowllm.core.types import Block, InfraCause, ToolResult, ToolSpec
from flowllm.tools.client.connection import (
    DEFAULT_START_TIMEOUT_S,
    PING_TIMEOUT_S,
    ProtocolFailure,
    ServerFailure,
    ServerHandle,
)
from flowllm.tools.client.results import convert_content, convert_result, truncate_text
from flowllm.tools.client.routing import READ_RESOURCE_SCHEMA, READ_RESOURCE_TOOL, argument_problem, route, tool_names
from flowllm.tools.client.sampling import SAMPLING_DECLINED, SAMPLING_SHARED, Sampler
from flowllm.tools.client.settings import PoolSettings, Scope, ServerSpec, load_settings
from flowllm.tools.common import scrub_workspace, workspace_spellings
from flowllm.tools.needs import result_infra
from flowllm.tools.state import STATE_META_KEY, TaskState, result_state_update, tool_asks_for_state
from flowllm.tools.taskfolder import WORKSPACE_META_KEY, tool_asks_for_workspace

log = logging.getLogger(__name__)

__all__ = [
    "PoolSettings",
    "ServerSpec",
    "ToolCatalog",
    "ToolPool",
    "convert_result",
    "discover_tools",
    "load_settings",
    "open_tool_catalog",
    "open_tool_pool",
    "truncate_text",
]


def _error(call_id: str, server: str | None, name: str, message: str, infra: InfraCause | None = None) -> ToolResult:
    return ToolResult(
        call_id=call_id, server=server, name=name, content=f"Error: {message}", is_error=True, infra=infra
    )


def _failure_cause(exc: ServerFailure) -> InfraCause:
    return InfraCause.PROTOCOL if isinstance(exc, ProtocolFailure) else InfraCause.SERVER_LOST


def _cap(text: str, limit: int) -> str:
    if limit <= 0:
        return ""
    return text if len(text) <= limit else text[:limit] + f" [... cut at {limit:,} characters]"


@dataclass
class _Listing:
    """What one server offered when the catalog checked it."""

    tools: dict[str, types.Tool]
    instructions: str = ""
    resources: bool = False


@dataclass
class ToolCatalog:
    """The run's view of its servers: their listings, the run-scoped live handles, the unavailable ones."""

    listings: dict[str, _Listing] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    # The entries of ``unavailable`` that a started server gave itself (a tool that cannot work here): warnings,
    # not failures to start.
    withdrawn: dict[str, str] = field(default_factory=dict)
    shared: dict[str, ServerHandle] = field(default_factory=dict)  # scope=run: one connection for all tasks
    startup_seconds: float = 0.0

    @property
    def tools(self) -> dict[str, dict[str, types.Tool]]:
        return {name: dict(listing.tools) for name, listing in self.listings.items()}

    async def aclose(self) -> None:
        await asyncio.gather(*(h.close() for h in self.shared.values()), return_exceptions=True)
        self.shared.clear()


def withdrawn_report(
    server: str, offered: Mapping[str, Any], withdrawn: Mapping[str, str], limited: Mapping[str, str]
) -> dict[str, str]:
    """``tools.unavailable`` entries for what a started server says cannot work: the server's name when none of
    its tools is offered, else ``server.tool`` for each tool withdrawn or limited (still offered, in part)."""
    if withdrawn and not offered:
        reasons = list(dict.fromkeys(withdrawn.values()))
        return {server: "; ".join(reasons) + f" (tools not offered: {', '.join(sorted(withdrawn))})"}
    entries = {f"{server}.{tool}": f"{why} (not offered)" for tool, why in withdrawn.items()}
    entries.update({f"{server}.{tool}": f"{why} (offered for the rest)" for tool, why in limited.items()})
    return entries


def _disabled_reason(spec: ServerSpec) -> str | None:
    missing = spec.missing_env()
    if not missing:
        return None
    return f"server '{spec.name}' is disabled: environment variable(s) {', '.join(missing)} not set"


@asynccontextmanager
async def open_tool_catalog(
    cfg: ToolsConfig | Mapping[str, Any] | Any,
    *,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ping_timeout_s: float = PING_TIMEOUT_S,
    keep_run_servers: bool = True,
) -> AsyncIterator[ToolCatalog]:
    """Check every server once for the run; keep the run-scoped ones connected until the context ends."""
    settings = load_settings(cfg)
    catalog = ToolCatalog()
    loop = asyncio.get_running_loop()
    began = loop.time()
    with scratch_folder("flowllm-tools-") as scratch:

        async def check(spec: ServerSpec) -> None:
            reason = _disabled_reason(spec)
            if reason is not None:
                log.warning("%s; its tools are not offered", reason)
                catalog.unavailable[spec.name] = reason
                return
            shared = keep_run_servers and spec.scope is Scope.RUN
            declined = SAMPLING_SHARED if shared and settings.sampling is SamplingMode.answer else SAMPLING_DECLINED
            handle = ServerHandle(
                spec,
                None if shared else Path(scratch),
                start_timeout_s,
                ping_timeout_s,
                sampling_declined=declined,
            )
            try:
                await handle.start()
            except ServerFailure as exc:
                log.warning("%s", exc)
                catalog.unavailable[spec.name] = str(exc)
                await handle.close()
                return
            for line in withdrawn_report(spec.name, handle.tools, handle.withdrawn, handle.limited).items():
                log.warning("%s is unavailable: %s", *line)
                catalog.unavailable.setdefault(*line)
                catalog.withdrawn.setdefault(*line)
            if not handle.tools:  # every tool withdrawn: nothing of it is offered, nothing of it runs
                await handle.close()
                return
            catalog.listings[spec.name] = _Listing(dict(handle.tools), handle.instructions, handle.resources)
            if shared:
                catalog.shared[spec.name] = handle
            else:
                await handle.close()

        try:
            await asyncio.gather(*(check(s) for s in settings.servers))
        except BaseException:
            await catalog.aclose()
            raise
    catalog.startup_seconds = loop.time() - began
    try:
        yield catalog
    finally:
        await catalog.aclose()


async def discover_tools(
    cfg: ToolsConfig | Mapping[str, Any] | Any,
    workspace: Path | None = None,
    *,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
) -> ToolCatalog:
    """Every server's tools, checked once and stopped (no run-scoped connections are kept)."""
    async with open_tool_catalog(cfg, start_timeout_s=start_timeout_s, keep_run_servers=False) as catalog:
        return ToolCatalog(
            listings=dict(catalog.listings), unavailable=dict(catalog.unavailable), withdrawn=dict(catalog.withdrawn)
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
        sampler: Sampler | None = None,
        state_file: Path | None = None,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        # Answers the sampling requests of the servers this pool starts (tools.sampling=answer), once the task's
        # agent has bound a handler to it; None: they are declined.
        self.sampler: Sampler | None = sampler
        if sampler is None and settings.sampling is SamplingMode.answer:
            self.sampler = Sampler()
        self.workspace = Path(workspace).resolve()
        self._spellings = workspace_spellings(self.workspace)
        self._handles: dict[str, ServerHandle] = {}
        self._owned: list[ServerHandle] = []  # the handles this pool starts and stops (not the run's)
        self._unavailable: dict[str, str] = {}  # server -> why (disabled for a missing key, failed to start)
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False
        self._task_state: TaskState | None = None
        # Where the task's key-value store is saved: its records folder (the runner's ``tasks/<id>/state.json``);
        # by default beside the workspace, for a caller whose workspace is inside the task's folder.
        self._state_file = state_file
        self._workspace_made = False
        for spec in settings.servers:
            if catalog is not None:
                if spec.name in catalog.unavailable:  # warned about once, by the catalog
                    self._unavailable[spec.name] = catalog.unavailable[spec.name]
                    continue
                if spec.name in catalog.shared:
                    self._handles[spec.name] = catalog.shared[spec.name]
                    continue
            else:
                reason = _disabled_reason(spec)
                if reason is not None:
                    log.warning("%s; its tools are not offered", reason)
                    self._unavailable[spec.name] = reason
                    continue
            handle = ServerHandle(spec, self.workspace, start_timeout_s, ping_timeout_s, sampler=self.sampler)
            if catalog is not None:
                listing = catalog.listings.get(spec.name, _Listing({}))
                handle.tools = dict(listing.tools)
                handle.instructions = listing.instructions
                handle.resources = listing.resources
            self._handles[spec.name] = handle
            self._owned.append(handle)

    async def start(self) -> None:
        """Start every enabled server concurrently; a server that fails is logged and left out.

        With a catalog nothing starts here: each task-scoped server starts on its first call.
        """
        if self.catalog is not None:
            return

        async def start_one(handle: ServerHandle) -> None:
            try:
                await handle.start()
            except ServerFailure as exc:
                log.warning("%s", exc)
                self._unavailable[handle.spec.name] = str(exc)
                return
            name = handle.spec.name
            for line in withdrawn_report(name, handle.tools, handle.withdrawn, handle.limited).items():
                log.warning("%s is unavailable: %s", *line)
                self._unavailable.setdefault(*line)

        await asyncio.gather(*(start_one(h) for h in self._owned))

    @property
    def unavailable(self) -> dict[str, str]:
        """Servers that are configured but not usable, with the reason (for logs and the run summary)."""
        return dict(self._unavailable)

    async def list_tools(self) -> list[ToolSpec]:
        specs: list[ToolSpec] = []
        for handle in self._handles.values():
            if handle.tools_stale:
                await handle.refresh_tools()
            if not handle.tools or handle.problem is not None:
                continue
            first = True
            for name in tool_names(handle):
                tool = handle.tools.get(name)
                spec: ToolSpec = {
                    "server": handle.spec.name,
                    "name": name,
                    "description": (tool.description or tool.title or "")
                    if tool is not None
                    else "Read a resource of this server by its URI (as a tool result or link named it).",
                    "input_schema": dict(tool.input_schema or {"type": "object", "properties": {}})
                    if tool is not None
                    else dict(READ_RESOURCE_SCHEMA),
                }
                instructions = _cap(handle.instructions, self.settings.instructions_max_chars)
                if first and instructions:
                    spec["server_instructions"] = instructions
                first = False
                specs.append(spec)
        return specs

    @property
    def task_state(self) -> TaskState:
        """The task's key-value store (flowllm/tools/state.py), saved in ``state_file`` (default: next to the
        workspace); a new pool (a new attempt) starts it empty."""
        if self._task_state is None:
            if self._state_file is not None:
                self._task_state = TaskState(self._state_file, fresh=True)
            else:
                self._task_state = TaskState.for_workspace(self.workspace, fresh=True)
        return self._task_state

    @property
    def startup_seconds(self) -> float:
        """Time this task's own servers spent starting (they start on their first call): start-up, reported
        apart from the calls (``timing.json`` → ``tools_start_s``)."""
        return sum(handle.start_seconds for handle in self._owned)

    def _make_workspace(self) -> None:
        """The task's folder, made on the first call that works in it (``flowllm.run.workspaces``)."""
        if not self._workspace_made:
            self.workspace.mkdir(parents=True, exist_ok=True)
            self._workspace_made = True

    def _scrub(self, text: str) -> str:
        return scrub_workspace(text, self._spellings)

    async def call(
        self,
        server: str | None,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str,
        timeout_s: float,
        state: TaskStore | None = None,
    ) -> ToolResult:
        """Run one tool call; every tool-side problem comes back as an error result (see the module doc).

        ``state``: the task's store, handed only to tools that ask for it (their ``_meta``); their changes come
        back in the result and are applied to it."""
        if self._closed:
            return _error(call_id, server, name, "the tool pool is closed")
        routed = route(self._handles, self._unavailable, server, name)
        if isinstance(routed, str):
            named = self._handles.get(server or "")
            down = (server or "") in self._unavailable or (named is not None and named.problem is not None)
            return _error(call_id, server, name, self._scrub(routed), InfraCause.UNAVAILABLE if down else None)
        handle = routed
        server = handle.spec.name
        problem = argument_problem(handle, name, arguments)
        if problem:
            return _error(call_id, server, name, problem)
        try:
            await handle.ensure_started()
        except ServerFailure as exc:
            self._unavailable.setdefault(server, str(exc))
            return _error(call_id, server, name, self._scrub(str(exc)), InfraCause.UNAVAILABLE)
        if name not in handle.tools:  # the resource reader flowllm adds
            return await self._read_resource(handle, call_id, str(arguments["uri"]), timeout_s)
        tool = handle.tools[name]
        limits = [t for t in (timeout_s, handle.spec.timeout_s) if t and t > 0]
        limit = min(limits) if limits else None
        stateful = state is not None and tool_asks_for_state(tool)
        meta: dict[str, Any] = {}
        if state is not None and stateful:
            meta[STATE_META_KEY] = state.values(server)
        if tool_asks_for_workspace(tool):  # a server shared by the run learns the task's folder call by call
            self._make_workspace()
            meta[WORKSPACE_META_KEY] = str(self.workspace)
        progress: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(limit):
                result = await handle.call_tool(name, arguments, meta or None, progress)
        except TimeoutError:
            self._spawn(handle.check_health())
            return _error(
                call_id,
                server,
                name,
                f"{server}.{name} did not finish within {limit:g} s and was abandoned; "
                "try a smaller piece of work or different arguments",
            )
        except ServerFailure as exc:
            return _error(call_id, server, name, self._scrub(str(exc)), _failure_cause(exc))
        update = result_state_update(result) if stateful else None
        if state is not None and update:
            try:
                state.apply(server, update)
            except ValueError as exc:
                return _error(call_id, server, name, f"{server}.{name} sent an unusable state update: {exc}")
        text, images, parts, structured = convert_content(result)
        done = self._result(call_id, server, name, text, images, parts, bool(result.is_error), structured, progress)
        done.infra = result_infra(result) if result.is_error else None  # the server's own word (needs.py)
        return done

    def _result(
        self,
        call_id: str,
        server: str,
        name: str,
        text: str,
        images: list[Block],
        parts: list[Block],
        is_error: bool,
        structured: Any = None,
        progress: list[dict[str, Any]] | None = None,
    ) -> ToolResult:
        if not text and not images:
            text = "(the tool returned no content)"
        limit = self.settings.max_result_chars
        text = truncate_text(self._scrub(text), limit)
        parts = [
            {"type": "text", "text": truncate_text(self._scrub(p["text"]), limit)} if p.get("type") == "text" else p
            for p in parts
        ]
        return ToolResult(
            call_id=call_id,
            server=server,
            name=name,
            content=text,
            is_error=is_error,
            images=images,
            parts=parts,
            structured=structured,
            progress=progress or [],
        )

    async def _read_resource(self, handle: ServerHandle, call_id: str, uri: str, timeout_s: float) -> ToolResult:
        server = handle.spec.name
        try:
            async with asyncio.timeout(timeout_s if timeout_s > 0 else None):
                read = await handle.read_resource(uri)
        except TimeoutError:
            return _error(call_id, server, READ_RESOURCE_TOOL, f"reading {uri} did not finish within {timeout_s:g} s")
        except ServerFailure as exc:
            return _error(call_id, server, READ_RESOURCE_TOOL, self._scrub(str(exc)), _failure_cause(exc))
        texts: list[str] = []
        images: list[Block] = []
        parts: list[Block] = []
        for item in read.contents:
            if isinstance(item, types.TextResourceContents):
                texts.append(item.text)
                parts.append({"type": "text", "text": item.text})
            elif (item.mime_type or "").startswith("image/"):
                block: Block = {"type": "image", "media_type": item.mime_type or "image/png", "data": item.blob}
                images.append(block)
                parts.append(block)
            else:
                kind = item.mime_type or "unknown type"
                note = f"[binary resource {item.uri} ({kind}), {len(item.blob) * 3 // 4:,} bytes, not shown]"
                texts.append(note)
                parts.append({"type": "text", "text": note})
        return self._result(
            call_id, server, READ_RESOURCE_TOOL, "\n".join(texts), images, parts if images else [], False
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        """Stop every server this pool started (idempotent). Safe to call while the caller is being cancelled."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._background):
            task.cancel()
        closing = asyncio.gather(
            *(asyncio.shield(t) for t in self._background),
            *(h.close() for h in self._owned),
            return_exceptions=True,
        )
        # Shielded so a second cancellation cannot interrupt the shutdown half-way: the servers still stop.
        await asyncio.shield(closing)


@asynccontextmanager
async def open_tool_pool(
    cfg: ToolsConfig | Mapping[str, Any] | Any,
    workspace: Path,
    *,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ping_timeout_s: float = PING_TIMEOUT_S,
    catalog: ToolCatalog | None = None,
    sampler: Sampler | None = None,
    state_file: Path | None = None,
) -> AsyncIterator[ToolPool]:
    """Start the servers of ``cfg`` for the task folder ``workspace``; stop them all on leaving the context.

    ``start_timeout_s`` bounds each server's start (spawn, handshake, tool listing); ``ping_timeout_s`` is how
    long a server may take to answer the health check that follows a timed-out call before it is restarted.
    ``sampler``: who answers the servers' sampling requests (default: a new one when ``tools.sampling=answer``,
    else none: declined). ``state_file``: where the task's key-value store is saved (``tools.task_state``;
    default: ``state.json`` beside ``workspace``).
    """
    pool = ToolPool(
        load_settings(cfg),
        Path(workspace),
        start_timeout_s=start_timeout_s,
        ping_timeout_s=ping_timeout_s,
        catalog=catalog,
        sampler=sampler,
        state_file=state_file,
    )
    try:
        await pool.start()
        yield pool
    finally:
        await pool.aclose()
