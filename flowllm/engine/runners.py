"""One contract, three execution strategies for a turn graph.

Every runner takes the turn's initial state, runs each node once through the same ``execute_node`` (inputs
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
import time
import traceback
import weakref
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol

from flowllm.engine.context import FanOut, TurnContext
from flowllm.engine.errors import NodeContractError, NodeExecutionError, PipelineError
from flowllm.engine.node import BoundNode
from flowllm.engine.pipeline import Pipeline


class NodeObserver(Protocol):
    """Receives every node's exchange (the recorder implements it)."""

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


async def execute_node(
    node: BoundNode, state: Mapping[str, Any], ctx: TurnContext, observer: NodeObserver | None, runner: str
) -> dict[str, Any]:
    """Run one node on the state; return its outputs keyed by state key. Raises NodeExecutionError."""
    return await _execute(_Step(node), state, ctx, observer, runner)


async def _execute(
    step: _Step, state: Mapping[str, Any], ctx: TurnContext, observer: NodeObserver | None, runner: str
) -> dict[str, Any]:
    inputs = step.gather(state)
    if observer is None:
        # Nobody records this node: no clocks, no meta.
        try:
            result = step.run(ctx, **inputs)
            if step.is_async or inspect.isawaitable(result):
                result = await result
            step.check(result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise NodeExecutionError(step.name, exc) from exc
        return step.keyed(result)
    started = time.time()
    t0 = time.perf_counter()
    try:
        result = step.run(ctx, **inputs)
        if step.is_async or inspect.isawaitable(result):
            result = await result
        step.check(result)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        observer.on_node(ctx, step.node, inputs, None, _meta(started, t0, runner, exc))
        raise NodeExecutionError(step.name, exc) from exc
    observer.on_node(ctx, step.node, inputs, result, _meta(started, t0, runner, None))
    return step.keyed(result)


class _Pending:
    """A node declared sync whose ``run`` returned an awaitable (a callable object wrapping a coroutine)."""

    __slots__ = ("awaitable", "inputs", "started", "t0")

    def __init__(self, awaitable: Any, inputs: dict[str, Any], started: float, t0: float) -> None:
        self.awaitable = awaitable
        self.inputs = inputs
        self.started = started
        self.t0 = t0


def _execute_sync(
    step: _Step, state: Mapping[str, Any], ctx: TurnContext, observer: NodeObserver | None, runner: str
) -> dict[str, Any] | _Pending:
    """``_execute`` for a node whose ``run`` is a plain function, without a coroutine per node.

    If ``run`` returns an awaitable after all, that is handed back as a ``_Pending`` for ``_finish`` to await
    (``run`` is never called twice).
    """
    inputs = step.gather(state)
    started = time.time() if observer is not None else 0.0
    t0 = time.perf_counter() if observer is not None else 0.0
    try:
        result = step.run(ctx, **inputs)
        if inspect.isawaitable(result):
            return _Pending(result, inputs, started, t0)
        step.check(result)
    except Exception as exc:
        if observer is not None:
            observer.on_node(ctx, step.node, inputs, None, _meta(started, t0, runner, exc))
        raise NodeExecutionError(step.name, exc) from exc
    if observer is not None:
        observer.on_node(ctx, step.node, inputs, result, _meta(started, t0, runner, None))
    return step.keyed(result)


async def _finish(
    step: _Step, pending: _Pending, ctx: TurnContext, observer: NodeObserver | None, runner: str
) -> dict[str, Any]:
    try:
        result = await pending.awaitable
        step.check(result)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if observer is not None:
            observer.on_node(ctx, step.node, pending.inputs, None, _meta(pending.started, pending.t0, runner, exc))
        raise NodeExecutionError(step.name, exc) from exc
    if observer is not None:
        observer.on_node(ctx, step.node, pending.inputs, result, _meta(pending.started, pending.t0, runner, None))
    return step.keyed(result)


async def _execute_any(
    step: _Step, state: Mapping[str, Any], ctx: TurnContext, observer: NodeObserver | None, runner: str
) -> dict[str, Any]:
    if step.is_async:
        return await _execute(step, state, ctx, observer, runner)
    out = _execute_sync(step, state, ctx, observer, runner)
    if isinstance(out, _Pending):
        return await _finish(step, out, ctx, observer, runner)
    return out


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
    built for it. An observer without ``records_nodes`` always receives every node."""
    if observer is None or getattr(observer, "records_nodes", True):
        return observer
    return None


class Runner:
    """Base of the three strategies: ``run`` a pipeline for one turn."""

    name: ClassVar[str] = ""
    concurrent_fanout: ClassVar[bool] = False

    def __init__(self, item_timeout_s: float = 120.0, turn_timeout_s: float = 600.0) -> None:
        self.item_timeout_s = item_timeout_s
        self.turn_timeout_s = turn_timeout_s

    def validate(self, pipeline: Pipeline) -> None:
        """Refuse a pipeline this strategy cannot run (checked once, before any task)."""

    def fanout(self) -> FanOut:
        return FanOut(self.concurrent_fanout, self.item_timeout_s, self.turn_timeout_s)

    def prepare(self, ctx: TurnContext) -> TurnContext:
        return replace(ctx, fanout=self.fanout())

    async def run(
        self,
        pipeline: Pipeline,
        inputs: Mapping[str, Any],
        ctx: TurnContext,
        observer: NodeObserver | None = None,
    ) -> dict[str, Any]:
        raise NotImplementedError


class _SerialRunner(Runner):
    def order(self, pipeline: Pipeline) -> list[BoundNode]:
        raise NotImplementedError

    def _steps(self, plan: _Plan) -> list[_Step]:
        raise NotImplementedError

    async def run(
        self,
        pipeline: Pipeline,
        inputs: Mapping[str, Any],
        ctx: TurnContext,
        observer: NodeObserver | None = None,
    ) -> dict[str, Any]:
        ctx = self.prepare(ctx)
        observer = _active(observer)
        state = dict(inputs)
        for step in self._steps(_plan(pipeline)):
            state.update(await _execute_any(step, state, ctx, observer, self.name))
        return state


class LegacyRunner(_SerialRunner):
    """The reference behaviour: the nodes in the order the YAML lists them."""

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

    def order(self, pipeline: Pipeline) -> list[BoundNode]:
        return pipeline.nodes

    def _steps(self, plan: _Plan) -> list[_Step]:
        return plan.steps


class GraphRunner(_SerialRunner):
    """Serial, in the graph's topological order (computed once per pipeline)."""

    name = "graph"

    def order(self, pipeline: Pipeline) -> list[BoundNode]:
        return pipeline.topological

    def _steps(self, plan: _Plan) -> list[_Step]:
        return plan.topological


class GraphParallelRunner(Runner):
    """Each node starts when its producers are done; independent nodes and fan-out items overlap.

    Only what can overlap gets an asyncio task: a plain (sync) node runs at once when it is ready, since it would
    hold the event loop in a task just the same, and an async node that is the only work left is awaited
    directly. Several ready async nodes run as concurrent tasks. Ready nodes start in YAML order and finished
    tasks are applied in YAML order, so the state and what starts next do not depend on timing.
    """

    name = "graph_parallel"
    concurrent_fanout = True

    async def run(
        self,
        pipeline: Pipeline,
        inputs: Mapping[str, Any],
        ctx: TurnContext,
        observer: NodeObserver | None = None,
    ) -> dict[str, Any]:
        ctx = self.prepare(ctx)
        observer = _active(observer)
        plan = _plan(pipeline)
        state = dict(inputs)
        waiting = dict(plan.waiting)
        ready = [s for s in plan.steps if waiting[s.name] == 0]  # kept in YAML order
        running: dict[asyncio.Future[dict[str, Any]], _Step] = {}

        def finished(step: _Step, outputs: dict[str, Any]) -> None:
            state.update(outputs)
            added = False
            for succ in plan.successors[step.name]:
                waiting[succ.name] -= 1
                if waiting[succ.name] == 0:
                    ready.append(succ)
                    added = True
            if added:
                ready.sort(key=lambda s: s.index)

        try:
            while ready or running:
                while ready:
                    step = ready.pop(0)
                    work: Awaitable[dict[str, Any]]
                    if step.is_async:
                        work = _execute(step, state, ctx, observer, self.name)
                    else:
                        out = _execute_sync(step, state, ctx, observer, self.name)
                        if not isinstance(out, _Pending):
                            finished(step, out)
                            continue
                        work = _finish(step, out, ctx, observer, self.name)
                    if not ready and not running:
                        # The only work left: nothing to overlap it with, so no task.
                        finished(step, await work)
                        continue
                    running[asyncio.ensure_future(work)] = step
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
        return state


RUNNERS: dict[str, type[Runner]] = {r.name: r for r in (LegacyRunner, GraphRunner, GraphParallelRunner)}


def make_runner(name: str, item_timeout_s: float = 120.0, turn_timeout_s: float = 600.0) -> Runner:
    try:
        cls = RUNNERS[name]
    except KeyError:
        raise PipelineError(f"unknown runner '{name}'; choose one of: {', '.join(RUNNERS)} (runner=<name>)") from None
    return cls(item_timeout_s=item_timeout_s, turn_timeout_s=turn_timeout_s)
