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
from collections.abc import Mapping
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


async def execute_node(
    node: BoundNode, state: Mapping[str, Any], ctx: TurnContext, observer: NodeObserver | None, runner: str
) -> dict[str, Any]:
    """Run one node on the state; return its outputs keyed by state key. Raises NodeExecutionError."""
    inputs = node.gather_inputs(state)
    started = time.time()
    t0 = time.perf_counter()
    try:
        result = node.node.run(ctx, **inputs)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, Mapping) or set(result) != set(node.ports.outputs):
            got = sorted(result) if isinstance(result, Mapping) else type(result).__name__
            raise NodeContractError(
                f"returned {got}, but declares outputs {list(node.ports.outputs)}", node=node.name
            )
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if observer is not None:
            observer.on_node(ctx, node, inputs, None, _meta(started, t0, runner, exc))
        raise NodeExecutionError(node.name, exc) from exc
    if observer is not None:
        observer.on_node(ctx, node, inputs, result, _meta(started, t0, runner, None))
    return {node.output_key(port): value for port, value in result.items()}


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

    async def run(
        self,
        pipeline: Pipeline,
        inputs: Mapping[str, Any],
        ctx: TurnContext,
        observer: NodeObserver | None = None,
    ) -> dict[str, Any]:
        ctx = self.prepare(ctx)
        state = dict(inputs)
        for node in self.order(pipeline):
            state.update(await execute_node(node, state, ctx, observer, self.name))
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


class GraphRunner(_SerialRunner):
    """Serial, in the graph's topological order (computed once per pipeline)."""

    name = "graph"

    def order(self, pipeline: Pipeline) -> list[BoundNode]:
        return pipeline.topological


class GraphParallelRunner(Runner):
    """Each node starts when its producers are done; independent nodes and fan-out items overlap."""

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
        state = dict(inputs)
        waiting = {name: len(preds) for name, preds in pipeline.predecessors.items()}
        by_name = {n.name: n for n in pipeline.nodes}
        running: dict[asyncio.Task[dict[str, Any]], str] = {}

        def start(name: str) -> None:
            task = asyncio.ensure_future(execute_node(by_name[name], state, ctx, observer, self.name))
            running[task] = name

        # Start roots in YAML order so equal-priority work begins deterministically.
        for node in pipeline.nodes:
            if waiting[node.name] == 0:
                start(node.name)
        try:
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                # Apply finished nodes in YAML order: the state and what starts next do not depend on timing.
                for task in sorted(done, key=lambda t: by_name[running[t]].index):
                    name = running.pop(task)
                    state.update(task.result())
                    for succ in pipeline.successors[name]:
                        waiting[succ] -= 1
                        if waiting[succ] == 0:
                            start(succ)
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        return state


RUNNERS: dict[str, type[Runner]] = {r.name: r for r in (LegacyRunner, GraphRunner, GraphParallelRunner)}


def make_runner(name: str, item_timeout_s: float = 120.0, turn_timeout_s: float = 600.0) -> Runner:
    try:
        cls = RUNNERS[name]
    except KeyError:
        raise PipelineError(
            f"unknown runner '{name}'; choose one of: {', '.join(RUNNERS)} (runner=<name>)"
        ) from None
    return cls(item_timeout_s=item_timeout_s, turn_timeout_s=turn_timeout_s)
