"""Fork at divergence: replay a saved run while it is still the same conversation, then continue it live.

    python -m flowllm provider=replay provider.run_dir=RUN provider.fork=live provider.live=offline repair=strict

Each model call of a task is first compared with the saved run's call for the same (task, agent, turn): while
the request the new pipeline built equals the saved request, the saved reply is served, as ``provider=replay``
does (nothing is spent). At the first call whose request differs (a stricter repair turned a tool call into
an error, a tool returned something else, the new pipeline asked for a turn the saved run never made), or at
``provider.fork_at_turn``, the task forks: that call and every later call of the task (its sub-agents' too)
go to the live provider (``provider.live``, a ``conf/provider`` choice opened like any run's provider: its
emulator, retries, fallbacks and the run's usage ledger). The conversation the live provider continues is the
one the replayed prefix built, rebuilt for the live provider's wire protocol and model from the canonical
prompt (``WireRequest.canonical``), so the rest of the task is a real run: recorded, billed, scored.

A saved reply is kept when the request it answered is the same, even if the new stages read it differently
(it was the model's reply to exactly that request); the changed reading changes the next request, which forks.

Tool state at the fork needs nothing special: the prefix's tool calls are executed again, in the task's fresh
workspace, and each result is compared with the saved one by the replay audit; a different result changes the
next request, which forks. The web tools read the saved run's cache first (``flowllm/setup/webconf.py``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowllm.config.provider_schema import ForkMode, ProviderConfig
from flowllm.config.saved import saved_section
from flowllm.core.interfaces import CallContext, Provider
from flowllm.core.types import Block, Message, ModelResponse, ToolSpec, Usage
from flowllm.engine.pipeline import Pipeline
from flowllm.errors import ConfigError
from flowllm.providers.base import BaseProvider
from flowllm.providers.errors import ProviderConfigError, ProviderError
from flowllm.providers.factory import Opening, check_provider_config, open_provider
from flowllm.providers.registry import ProviderTable, Resolver
from flowllm.providers.replay import (
    REPLAY_PROTOCOL,
    ReplayMissError,
    ReplayProvider,
    build_replay_provider,
    checked_run_dir,
    source_provider_config,
)
from flowllm.providers.resilient import WireRequest
from flowllm.rundir.jsondiff import first_difference
from flowllm.rundir.layout import RunLayout

log = logging.getLogger(__name__)

# Added to a live reply (beside the resilient layer's route record): who answered after the fork, and the
# request really sent when it is not the one recorded (the recorded one is built like the saved run's, so the
# two runs' records compare; the live provider may have another model or protocol).
FORK_KEY = "flowllm_fork"
DESCRIBE_CHARS = 160
_SCOPE_TURN = re.compile(r"^turn_(\d+)/")


@dataclass(frozen=True)
class ForkPoint:
    """Where a task went live: the call (turn, and the sub-agent scope when it was one's) and why."""

    turn: int
    reason: str
    agent: str = "main"
    scope: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"turn": self.turn, "reason": self.reason}
        if self.scope:
            out["agent"], out["scope"] = self.agent, self.scope
        return out


@dataclass
class _TaskFork:
    point: ForkPoint
    calls: int = 0
    usage: Usage = field(default_factory=Usage)


class ForkLog:
    """Per task of the run: where it forked and what its live calls used (thread-safe)."""

    def __init__(self) -> None:
        self._tasks: dict[str, _TaskFork] = {}
        self._lock = threading.Lock()

    def point(self, task_id: str) -> ForkPoint | None:
        with self._lock:
            entry = self._tasks.get(task_id)
        return None if entry is None else entry.point

    def fork(self, task_id: str, point: ForkPoint) -> ForkPoint:
        """Record the fork; the first one of a task wins (concurrent sub-agents may find it at once)."""
        with self._lock:
            return self._tasks.setdefault(task_id, _TaskFork(point)).point

    def add_live(self, task_id: str, usage: Usage) -> None:
        with self._lock:
            entry = self._tasks[task_id]
            entry.calls += 1
            entry.usage = entry.usage + usage

    def live(self, task_id: str) -> tuple[int, Usage]:
        """The live calls of a task and their usage (0 and nothing for a task that never forked)."""
        with self._lock:
            entry = self._tasks.get(task_id)
        return (0, Usage()) if entry is None else (entry.calls, entry.usage)

    def forget(self, task_id: str) -> None:
        """A new attempt at the task replays from turn 1 again."""
        with self._lock:
            self._tasks.pop(task_id, None)


def main_turn(context: CallContext) -> int:
    """The main agent's turn a call belongs to (a sub-agent's or vision call runs inside one)."""
    if not context.scope:
        return context.turn
    match = _SCOPE_TURN.match(context.scope)
    return int(match.group(1)) if match else context.turn


class ForkProvider(ReplayProvider):
    """Serves saved replies until a task's request differs, then sends the task's calls to ``live``."""

    def __init__(
        self,
        cfg: ProviderConfig,
        run_dir: Path,
        inner: BaseProvider,
        live: Provider,
        *,
        fork_at_turn: int | None,
        stack: contextlib.AsyncExitStack,
    ) -> None:
        super().__init__(cfg, run_dir, inner)
        self.live = live
        self.fork_at_turn = fork_at_turn
        self.forks = ForkLog()
        self._stack = stack

    def build_request(self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        # Built like the saved run's requests (so they compare), remembering the canonical prompt the live
        # provider rebuilds its own request from after a fork.
        request = WireRequest(self.inner.build_request(system=system, messages=messages, tools=tools))
        request.canonical = (system, messages, tools)
        return request

    def normalize(self, raw: dict[str, Any]) -> ModelResponse:
        if FORK_KEY in raw:
            return self.live.normalize(raw)
        return self.inner.normalize(raw)

    def _why_fork(self, request: dict[str, Any], context: CallContext) -> tuple[str | None, dict[str, Any] | None]:
        """(why this call forks, None) or (None, the saved reply to serve)."""
        if self.fork_at_turn is not None and main_turn(context) >= self.fork_at_turn:
            return f"provider.fork_at_turn={self.fork_at_turn}", None
        try:
            saved = self.saved_call(context)
        except ReplayMissError as exc:
            if not self.layout.task(context.task_id).is_dir():
                raise  # the saved run never had this task: nothing to fork from (the task is reported missing)
            # A turn the saved run never made, or one it kept no reply for: the conversation went elsewhere.
            return str(exc).split(": ", 1)[-1], None
        if saved.raw_request is not None and saved.raw_request != request:
            diff = first_difference(saved.raw_request, dict(request))
            if diff is not None:
                return f"the request differs: {diff.describe(DESCRIBE_CHARS)}", None
        return None, saved.raw_response

    def _live_request(self, request: dict[str, Any]) -> dict[str, Any]:
        canonical = request.canonical if isinstance(request, WireRequest) else None
        if canonical is not None:
            system, messages, tools = canonical
            return self.live.build_request(system=system, messages=messages, tools=tools)
        if self.live.protocol == self.protocol:
            return {**request, "model": self.live.model}
        raise ProviderError(f"fork: a request without its prompt cannot be rebuilt for {self.live.name}")

    async def send(self, request: dict[str, Any], *, context: CallContext) -> dict[str, Any]:
        if self.forks.point(context.task_id) is None:
            reason, saved = self._why_fork(request, context)
            if reason is None:
                assert saved is not None
                with self._lock:
                    self.served += 1
                return saved
            point = self.forks.fork(
                context.task_id, ForkPoint(context.turn, reason, agent=context.agent, scope=context.scope)
            )
            if point.reason == reason and point.turn == context.turn:
                log.info("fork: task %s goes live at turn %d (%s)", context.task_id, context.turn, reason)
        wire = self._live_request(request)
        raw = await self.live.send(wire, context=context)
        record: dict[str, Any] = {"provider": str(self.cfg.live), "model": self.live.model}
        if wire != request:
            record["request"] = dict(wire)
        raw[FORK_KEY] = record
        self.forks.add_live(context.task_id, self.live.normalize(raw).usage)
        return raw

    def resumed_reply(self, request: dict[str, Any], raw: dict[str, Any], context: CallContext) -> None:
        """A reply this run received before, served again to a task a rerun resumes (flowllm/run/resume.py): a
        live one is logged as when it came, where the task forked (and why, found again) and its usage."""
        if FORK_KEY not in raw:
            return
        if self.forks.point(context.task_id) is None:
            reason, _saved = self._why_fork(request, context)
            point = ForkPoint(context.turn, reason or "resumed live", agent=context.agent, scope=context.scope)
            self.forks.fork(context.task_id, point)
        self.forks.add_live(context.task_id, self.live.normalize(raw).usage)

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self._stack.aclose()

    def __repr__(self) -> str:
        return f"ForkProvider(run_dir={str(self.run_dir)!r}, live={self.live.name!r}, at_turn={self.fork_at_turn})"


def live_config(pcfg: ProviderConfig, resolve: Resolver | None) -> ProviderConfig:
    """The provider config ``provider.live`` names, checked; raises ``ProviderConfigError`` saying what to do."""
    if not pcfg.live:
        raise ProviderConfigError(
            "provider.fork=live needs provider.live=<a provider choice, e.g. claude or offline>: the provider that "
            "continues each task from its fork"
        )
    try:
        live = (resolve or ProviderTable())(str(pcfg.live))
    except (ProviderConfigError, ConfigError) as exc:
        raise ProviderConfigError(f"provider.live={pcfg.live}: {exc}") from None
    if live.protocol == REPLAY_PROTOCOL:
        raise ProviderConfigError(
            f"provider.live={pcfg.live} is itself a replay: name a provider that calls a model (e.g. claude or offline)"
        )
    try:
        check_provider_config(live, resolve=resolve)
    except ProviderConfigError as exc:
        raise ProviderConfigError(f"provider.live={pcfg.live}: {exc}") from None
    return live


def check_replay(cfg: ProviderConfig, resolve: Resolver | None) -> None:
    """``check_provider_config`` for ``protocol: replay``: the run to replay and, for a fork, its live provider."""
    if cfg.fork is None:
        if cfg.live or cfg.fork_at_turn is not None:
            raise ProviderConfigError("provider.live and provider.fork_at_turn need provider.fork=live")
        if cfg.run_dir:
            checked_run_dir(cfg)
        return
    if cfg.fork != ForkMode.live:
        raise ProviderConfigError(f"provider.fork must be live or null, not '{cfg.fork}'")
    if cfg.fork_at_turn is not None and cfg.fork_at_turn < 1:
        raise ProviderConfigError(f"provider.fork_at_turn must be a turn number (1 or more), not {cfg.fork_at_turn}")
    live = live_config(cfg, resolve)
    source, _chain = source_provider_config(checked_run_dir(cfg))
    if live.tool_protocol != source.tool_protocol:
        raise ProviderConfigError(
            f"provider.live={cfg.live} uses tool_protocol {live.tool_protocol}, the saved run used "
            f"{source.tool_protocol}: the forked conversation teaches tools one way (set "
            f"provider.live's tool_protocol to {source.tool_protocol})"
        )


def saved_node_names(run_dir: Path) -> list[str]:
    """The nodes of the saved run's turn graph, from its ``.hydra/config.yaml`` (empty when it names none)."""
    try:
        nodes = saved_section(RunLayout(run_dir).config, "pipeline.nodes", resolve=False)
    except ConfigError as exc:
        raise ProviderConfigError(f"provider.run_dir: {exc}") from None
    return [str(name) for name in nodes] if nodes is not None else []


def check_fork_pipeline(cfg: ProviderConfig, pipeline: Pipeline) -> None:
    """A fork compares each node with the saved run's: this pipeline must still have every saved node."""
    if cfg.protocol != REPLAY_PROTOCOL or cfg.fork is None or not cfg.run_dir:
        return
    run_dir = checked_run_dir(cfg)
    have = {node.name for node in pipeline.nodes}
    gone = [name for name in saved_node_names(run_dir) if name not in have]
    if gone:
        raise ProviderConfigError(
            f"provider.run_dir: the saved run's pipeline had node(s) {', '.join(gone)} that this pipeline lacks: a "
            "fork replays the saved turns node by node (use the saved run's pipeline, changing its settings)"
        )


async def open_replay_or_fork(pcfg: ProviderConfig, opening: Opening) -> Provider:
    """The ``register_protocol`` opener for ``protocol: replay``: a plain replay, or with ``fork=live`` a fork."""
    if pcfg.fork is None:
        return build_replay_provider(pcfg)
    replay = build_replay_provider(pcfg)
    live_cfg = live_config(pcfg, opening.resolve)
    stack = contextlib.AsyncExitStack()
    try:
        live = await stack.enter_async_context(
            open_provider(
                live_cfg, ledger=opening.ledger, resolve=opening.resolve, clock=opening.clock, sleep=opening.sleep
            )
        )
    except BaseException:
        await stack.aclose()
        await replay.inner.aclose()
        raise
    return ForkProvider(pcfg, replay.run_dir, replay.inner, live, fork_at_turn=pcfg.fork_at_turn, stack=stack)
