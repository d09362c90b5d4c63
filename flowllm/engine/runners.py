"""One contract, three execution strategies for a turn graph.

Every runner takes the turn's initial state, runs each node once through the same executor (``_Executor``: inputs
gathered from the state, outputs checked against the node's declaration, the exchange handed to the recorder),
and returns the final state. They differ only in the order and the overlap of nodes and fan-out items:

* ``legacy``: YAML order, one node after another, fan-out items one by one. No graph library involved.
* ``graph``: the graph's topological order (ties broken by YAML order), serial.
* ``graph_parallel``: a node starts as soon as its producers finished; fan-out items run concurrently.

For deterministic nodes all three produce the same state and the same artifacts.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time
import traceback
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol

from flowllm.config.schema import RunnerConfig
from flowllm.core.registry import Registry
from flowllm.core.timeouts import FANOUT_TIMEOUT_S, ITEM_TIMEOUT_S
from flowllm.engine.context import FanOut, TurnContext
from flowllm.engine.errors import NodeContractError, NodeExecutionError, PipelineError
from flowllm.engine.node import BoundNode
from flowllm.engine.pipeline import Pipeline
from flowllm.errors import ConfigError

log = logging.getLogger(__name__)


class NodeObserver(Protocol):
    """Receives every node's exchange (the recorder implements it)."""

    @property
    def records_nodes(self) -> bool:
        """False when it keeps nothing of a node (a recorder with snapshot=none): the runners then skip timing
        and meta for it."""
        ...

    @property
    def reads_meta(self) -> bool:
        """False when it reads a node's inputs and outputs but never its meta (start, duration, status, error):
        the replay audit with nothing to forward to. The runners then neither time the node nor build its meta,
        and hand it an empty one."""
        ...

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None: ...


class _Step:
    """A BoundNode compiled for the hot loop: its ports resolved to state keys once, not on every turn.

    A turn of trivial nodes costs a few microseconds per node, so property lookups, set building and method calls
    per port are most of the engine's overhead; this keeps them out of the loop.
    """

    __slots__ = ("index", "is_async", "name", "node", "optional", "outputs", "renames", "required", "run")

    def __init__(self, node: BoundNode) -> None:
        self.node = node
        self.name = node.name
        self.index = node.index
        self.run = node.node.run
        self.is_async = node.ports.is_async
        self.required = tuple((p, node.input_key(p)) for p in node.ports.required)
        self.optional = tuple((p, node.input_key(p)) for p in node.ports.optional)
        self.outputs = frozenset(node.ports.outputs)
        renames = {p: node.output_key(p) for p in node.ports.outputs}
        self.renames = None if all(p == k for p, k in renames.items()) else renames

    def gather(self, state: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = {port: state[key] for port, key in self.required}
        for port, key in self.optional:
            if key in state:
                kwargs[port] = state[key]
        return kwargs

    def check(self, result: Any) -> None:
        if (type(result) is dict or isinstance(result, Mapping)) and result.keys() == self.outputs:
            return
        got = sorted(result) if isinstance(result, Mapping) else type(result).__name__
        raise NodeContractError(f"returned {got}, but declares outputs {list(self.node.ports.outputs)}", node=self.name)

    def keyed(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """The outputs keyed by state key (a fresh dict: the node may hand out the same one every time)."""
        if self.renames is None:
            return dict(result)
        return {self.renames[port]: value for port, value in result.items()}


class _Plan:
    """A pipeline compiled for the runners: steps in YAML order, in topological order, and the graph's edges."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.steps = [_Step(n) for n in pipeline.nodes]
        by_name = {s.name: s for s in self.steps}
        self.topological = [by_name[n.name] for n in pipeline.topological]
        self.waiting = {s.name: len(pipeline.predecessors[s.name]) for s in self.steps}
        self.successors = {s.name: tuple(by_name[n] for n in pipeline.successors[s.name]) for s in self.steps}
        self.in_yaml_order = _InSequence(self.steps)
        self.in_topological_order = _InSequence(self.topological)


# Compiled plans by pipeline identity; the weak reference tells a live pipeline from a new one at a reused id.
_PLANS: dict[int, tuple[weakref.ref[Pipeline], _Plan]] = {}


def _plan(pipeline: Pipeline) -> _Plan:
    entry = _PLANS.get(id(pipeline))
    if entry is not None and entry[0]() is pipeline:
        return entry[1]
    plan = _Plan(pipeline)
    key = id(pipeline)
    _PLANS[key] = (weakref.ref(pipeline, lambda _ref: _PLANS.pop(key, None)), plan)
    return plan


class _Pending:
    """A started node whose ``run`` returned an awaitable: what ``_settle`` needs once it resolves."""

    __slots__ = ("awaitable", "inputs", "started", "t0")

    def __init__(self, awaitable: Any, inputs: dict[str, Any], started: float, t0: float) -> None:
        self.awaitable = awaitable
        self.inputs = inputs
        self.started = started
        self.t0 = t0


class _Executor:
    """The one node executor: run, await, check the outputs, record. Every runner goes through it.

    ``start`` calls ``run``; a plain function's result is settled at once, without a coroutine per node (a turn
    of trivial nodes costs a few microseconds per node, so that matters), and an awaitable comes back as a
    ``_Pending`` for ``finish``. ``run`` is called exactly once either way.
    """

    __slots__ = ("ctx", "observer", "runner", "timed")

    def __init__(self, ctx: TurnContext, observer: NodeObserver | None, runner: str) -> None:
        self.ctx = ctx
        self.observer = observer
        self.runner = runner
        self.timed = observer is not None and observer.reads_meta

    def start(self, step: _Step, state: Mapping[str, Any]) -> dict[str, Any] | _Pending:
        inputs = step.gather(state)
        timed = self.timed
        started = time.time() if timed else 0.0
        t0 = time.perf_counter() if timed else 0.0
        try:
            result = step.run(self.ctx, **inputs)
        except Exception as exc:
            raise self._failed(step, inputs, started, t0, exc) from exc
        if step.is_async or (type(result) is not dict and inspect.isawaitable(result)):
            return _Pending(result, inputs, started, t0)
        return self._settle(step, inputs, started, t0, result)

    async def finish(self, step: _Step, pending: _Pending) -> dict[str, Any]:
        try:
            result = await pending.awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise self._failed(step, pending.inputs, pending.started, pending.t0, exc) from exc
        return self._settle(step, pending.inputs, pending.started, pending.t0, result)

    async def execute(self, step: _Step, state: Mapping[str, Any]) -> dict[str, Any]:
        out = self.start(step, state)
        return await self.finish(step, out) if isinstance(out, _Pending) else out

    def _settle(self, step: _Step, inputs: dict[str, Any], started: float, t0: float, result: Any) -> dict[str, Any]:
        try:
            step.check(result)
        except Exception as exc:
            raise self._failed(step, inputs, started, t0, exc) from exc
        if self.observer is not None:
            meta = _meta(started, t0, self.runner, None) if self.timed else {}
            self.observer.on_node(self.ctx, step.node, inputs, result, meta)
        return step.keyed(result)

    def _failed(
        self, step: _Step, inputs: dict[str, Any], started: float, t0: float, exc: Exception
    ) -> NodeExecutionError:
        if self.observer is not None:
            meta = _meta(started, t0, self.runner, exc) if self.timed else {}
            self.observer.on_node(self.ctx, step.node, inputs, None, meta)
        return NodeExecutionError(step.name, exc)


def _meta(started: float, t0: float, runner: str, exc: BaseException | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "started_at": datetime.fromtimestamp(started, UTC).isoformat(),
        "duration_s": round(time.perf_counter() - t0, 6),
        "runner": runner,
        "status": "ok" if exc is None else "error",
    }
    if exc is not None:
        meta["error"] = f"{type(exc).__name__}: {exc}"
        meta["traceback"] = "".join(traceback.format_exception(exc))
    return meta


def _active(observer: NodeObserver | None) -> NodeObserver | None:
    """The observer, or None when it says it records no node (a recorder with snapshot=none): then no meta is
    built for it."""
    if observer is None or observer.records_nodes:
        return observer
    return None


class _Schedule:
    """When each node may start: the part in which the strategies differ. Ready nodes are kept in YAML order."""

    def first(self, plan: _Plan) -> list[_Step]:
        raise NotImplementedError

    def after(self, plan: _Plan, step: _Step) -> list[_Step]:
        """The nodes that became ready because ``step`` finished."""
        raise NotImplementedError


class _InSequence(_Schedule):
    """One node after another, in a fixed order (the YAML's, or the topological one). Keeps no state: one
    instance per pipeline serves every turn."""

    def __init__(self, sequence: list[_Step]) -> None:
        self.next_of = {a.name: b for a, b in itertools.pairwise(sequence)}
        self.head = sequence[:1]

    def first(self, plan: _Plan) -> list[_Step]:
        return list(self.head)

    def after(self, plan: _Plan, step: _Step) -> list[_Step]:
        nxt = self.next_of.get(step.name)
        return [nxt] if nxt is not None else []


class _WhenInputsReady(_Schedule):
    """A node is ready as soon as all its producers finished."""

    def __init__(self, plan: _Plan) -> None:
        self.waiting = dict(plan.waiting)

    def first(self, plan: _Plan) -> list[_Step]:
        return [s for s in plan.steps if self.waiting[s.name] == 0]

    def after(self, plan: _Plan, step: _Step) -> list[_Step]:
        ready = []
        for succ in plan.successors[step.name]:
            self.waiting[succ.name] -= 1
            if self.waiting[succ.name] == 0:
                ready.append(succ)
        return ready


async def _run_loop(schedule: _Schedule, plan: _Plan, state: dict[str, Any], ex: _Executor, overlap: bool) -> None:
    """The one runner loop. Ready nodes start in YAML order. Without ``overlap`` each node finishes before the
    next starts. With it, only what can overlap gets an asyncio task: a plain (sync) node runs at once (in a task
    it would hold the event loop just the same), and an async node that is the only work left is awaited
    directly; finished tasks are applied in YAML order, so the state and what starts next do not depend on
    timing."""
    ready = schedule.first(plan)
    running: dict[asyncio.Future[dict[str, Any]], _Step] = {}

    def finished(step: _Step, outputs: dict[str, Any]) -> None:
        state.update(outputs)
        added = schedule.after(plan, step)
        if added:
            ready.extend(added)
            if len(ready) > 1:
                ready.sort(key=lambda s: s.index)

    try:
        while ready or running:
            while ready:
                step = ready.pop(0)
                out = ex.start(step, state)
                if not isinstance(out, _Pending):
                    finished(step, out)
                    continue
                if not overlap or (not ready and not running):
                    finished(step, await ex.finish(step, out))
                    continue
                running[asyncio.ensure_future(ex.finish(step, out))] = step
            if not running:
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: running[f].index):
                finished(running.pop(fut), fut.result())
    finally:
        for fut in running:
            fut.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


class Runner:
    """One turn of a pipeline: the shared loop, with the strategy's schedule and overlap."""

    name: ClassVar[str] = ""
    concurrent_fanout: ClassVar[bool] = False  # fan-out items (tool calls) run concurrently
    overlap: ClassVar[bool] = False  # independent async nodes run concurrently

    def __init__(self, item_timeout_s: float = ITEM_TIMEOUT_S, fanout_timeout_s: float = FANOUT_TIMEOUT_S) -> None:
        if item_timeout_s <= 0 or fanout_timeout_s <= 0:
            raise PipelineError(
                "runner timeouts must be positive "
                f"(item_timeout_s={item_timeout_s}, fanout_timeout_s={fanout_timeout_s})"
            )
        self.item_timeout_s = item_timeout_s
        self.fanout_timeout_s = fanout_timeout_s
        # Read-only for the nodes: one serves every turn.
        self._fanout = FanOut(self.concurrent_fanout, item_timeout_s, fanout_timeout_s)

    def validate(self, pipeline: Pipeline) -> None:
        """Refuse a pipeline this strategy cannot run (checked once, before any task)."""

    def schedule(self, plan: _Plan) -> _Schedule:
        raise NotImplementedError

    async def run(
        self,
        pipeline: Pipeline,
        inputs: Mapping[str, Any],
        ctx: TurnContext,
        observer: NodeObserver | None = None,
    ) -> dict[str, Any]:
        ctx = ctx.with_fanout(self._fanout)
        plan = _plan(pipeline)
        state = dict(inputs)
        await _run_loop(self.schedule(plan), plan, state, _Executor(ctx, _active(observer), self.name), self.overlap)
        return state


class LegacyRunner(Runner):
    """The reference behaviour: the nodes in the order the YAML lists them, no graph library involved."""

    name = "legacy"

    def validate(self, pipeline: Pipeline) -> None:
        available = set(pipeline.provided)
        for node in pipeline.nodes:
            for key, required in node.consumes.items():
                if required and key not in available:
                    raise PipelineError(
                        f"consumes '{key}' before the node that produces it runs; the legacy runner follows "
                        "the YAML order, so list the producer first (or use runner=graph).",
                        node=node.name,
                        source=pipeline.source,
                    )
            available.update(node.produces)

    def schedule(self, plan: _Plan) -> _Schedule:
        return plan.in_yaml_order


class GraphRunner(Runner):
    """Serial, in the graph's topological order (computed once per pipeline)."""

    name = "graph"

    def schedule(self, plan: _Plan) -> _Schedule:
        return plan.in_topological_order


class GraphParallelRunner(Runner):
    """Each node starts when its producers are done; independent nodes and fan-out items overlap."""

    name = "graph_parallel"
    concurrent_fanout = True
    overlap = True

    def schedule(self, plan: _Plan) -> _Schedule:
        return _WhenInputsReady(plan)


def _runner_class(name: str, loaded: Any) -> type[Runner]:
    if not (isinstance(loaded, type) and issubclass(loaded, Runner)):
        raise TypeError(f"expected a subclass of flowllm.engine.runners.Runner, got {loaded!r}")
    return loaded


RUNNERS: Registry[type[Runner]] = Registry(
    "runner",
    {r.name: r for r in (LegacyRunner, GraphRunner, GraphParallelRunner)},
    group="flowllm.runners",
    adapt=_runner_class,
)


def make_runner(
    name: str, item_timeout_s: float = ITEM_TIMEOUT_S, fanout_timeout_s: float = FANOUT_TIMEOUT_S
) -> Runner:
    cls = RUNNERS.require(name, ConfigError)
    return cls(item_timeout_s=item_timeout_s, fanout_timeout_s=fanout_timeout_s)


def runner_from_config(cfg: RunnerConfig) -> Runner:
    """The runner the ``runner`` config section names. The old name of ``fanout_timeout_s``, ``turn_timeout_s``
    (it never bounded a turn, only one node's fan-out), still works and says so once."""
    fanout = cfg.fanout_timeout_s
    old = cfg.turn_timeout_s
    if old is not None:
        log.warning("runner.turn_timeout_s is deprecated: it is runner.fanout_timeout_s now (used %gs)", old)
        fanout = old
    return make_runner(cfg.name, cfg.item_timeout_s, fanout)
