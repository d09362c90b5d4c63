"""Engine overhead per node: the seven-node turn graph with trivial nodes, per runner, and the recorder's cost.

References measured in the same run: a plain Python loop calling the same ``run`` methods (what no engine at all
costs), LangGraph's ``StateGraph`` and Haystack's ``Pipeline`` running the same seven functions in the same
order (dev-only dependencies: ``pip install -e ".[bench]"``; without them their rows say "not installed").

    python -m benchmarks.overhead [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import Section, Sizes, Stat, Target, md_table, version_of
from benchmarks.turn_fixture import NODE_NAMES, trivial_pipeline, turn_inputs, typical_turn
from flowllm.engine import BoundNode, Pipeline, Recorder, TurnContext, make_runner
from flowllm.engine.recorder import atomic_write
from flowllm.engine.runners import NodeObserver

NODES = len(NODE_NAMES)
RUNNERS = ("legacy", "graph", "graph_parallel")
TARGET_US = {"legacy": 5.0, "graph": 5.0, "graph_parallel": 25.0}
RECORDER_TARGET_US = 50.0
PEER_LEAD = 10.0


def _timed(fn: Callable[[], Any], turns: int) -> float:
    """Seconds per turn over ``turns`` calls (garbage from earlier runs collected first)."""
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(turns):
        fn()
    return (time.perf_counter() - t0) / turns


# -- references ------------------------------------------------------------------------------------------


def plain_loop(pipeline: Pipeline, ctx: TurnContext) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The same ``run`` methods called one after another from a precomputed plan: no engine at all."""
    plan = [(n.node.run, n.ports.required) for n in pipeline.nodes]

    def turn(inputs: dict[str, Any]) -> dict[str, Any]:
        state = dict(inputs)
        for run, ports in plan:
            state.update(run(ctx, **{p: state[p] for p in ports}))
        return state

    return turn


def langgraph_turn(pipeline: Pipeline, ctx: TurnContext) -> Callable[[dict[str, Any]], Any] | None:
    try:
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return None
    from typing import TypedDict

    # LangGraph merges each node's return value into a typed state; every key is a plain "last value" channel.
    keys = sorted({*pipeline.provided, *pipeline.outputs})
    State = TypedDict("State", dict.fromkeys(keys, Any), total=False)  # type: ignore[misc]
    graph: Any = StateGraph(State)  # typed for TypedDict schemas; ours is built at run time

    def step(node: BoundNode) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
        run, ports = node.node.run, node.ports.required
        return lambda state: run(ctx, **{p: state[p] for p in ports})

    previous = START
    for node in pipeline.topological:
        graph.add_node(node.name, step(node))
        graph.add_edge(previous, node.name)
        previous = node.name
    graph.add_edge(previous, END)
    compiled: Any = graph.compile()
    return compiled.invoke


def haystack_turn(pipeline: Pipeline, ctx: TurnContext) -> Callable[[dict[str, Any]], Any] | None:
    try:
        from haystack import Pipeline as HaystackPipeline
        from haystack import component
    except ImportError:
        return None

    # A Haystack component declares its inputs by its run signature and its outputs with output_types: one class
    # per node, built from the node's ports, wired socket to socket along the same data edges as flowllm's graph.
    def make_component(node: BoundNode) -> Any:
        run, ports = node.node.run, node.ports.required
        namespace: dict[str, Any] = {"run_node": run, "ctx": ctx, "Any": Any}
        params = ", ".join(f"{p}: Any" for p in ports)
        exec(f"def run(self, {params}):\n    return run_node(ctx, {', '.join(f'{p}={p}' for p in ports)})", namespace)
        run_fn = component.output_types(**dict.fromkeys(node.ports.outputs, Any))(namespace["run"])
        cls = type(f"Bench_{node.name}", (), {"run": run_fn})
        built: Any = component(cls)
        return built()

    hp = HaystackPipeline()
    for node in pipeline.topological:
        hp.add_component(node.name, make_component(node))
    producer = {key: n.name for n in pipeline.nodes for key in n.produces}
    for node in pipeline.topological:
        for port in node.ports.required:
            if port in producer:
                hp.connect(f"{producer[port]}.{port}", f"{node.name}.{port}")

    def turn(inputs: dict[str, Any]) -> Any:
        data = {
            n.name: {p: inputs[p] for p in n.ports.required if p in inputs}
            for n in pipeline.nodes
            if any(p in inputs for p in n.ports.required)
        }
        return hp.run(data)

    return turn


# -- flowllm ---------------------------------------------------------------------------------------------


class TimedObserver:
    """Times each ``on_node`` call of the observer it wraps: how long the recorder holds the event loop."""

    def __init__(self, inner: NodeObserver) -> None:
        self.inner = inner
        self.calls: list[float] = []

    @property
    def records_nodes(self) -> bool:
        return self.inner.records_nodes

    @property
    def reads_meta(self) -> bool:
        return self.inner.reads_meta

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None:
        t0 = time.perf_counter()
        self.inner.on_node(ctx, node, inputs, outputs, meta)
        self.calls.append(time.perf_counter() - t0)


async def _runner_seconds(
    runner_name: str, pipeline: Pipeline, inputs: dict[str, Any], turns: int, observer: NodeObserver | None
) -> float:
    runner = make_runner(runner_name)
    gc.collect()
    t0 = time.perf_counter()
    for turn in range(turns):
        ctx = TurnContext(task_id="bench", turn=turn + 1)
        await runner.run(pipeline, inputs, ctx, observer)
    return (time.perf_counter() - t0) / turns


def measure(sizes: Sizes) -> dict[str, Any]:
    values = typical_turn()
    pipeline = trivial_pipeline(values)
    inputs = turn_inputs(values)
    ctx = TurnContext(task_id="bench", turn=1)
    results: dict[str, Any] = {}

    plain = plain_loop(pipeline, ctx)
    expected = plain(inputs)
    results["plain"] = Stat.of([_timed(lambda: plain(inputs), sizes.overhead_turns) for _ in range(sizes.runs)])

    for name in RUNNERS:
        # Same outputs as the plain loop, or the comparison would be meaningless.
        state = asyncio.run(make_runner(name).run(pipeline, inputs, ctx))
        assert state.keys() == expected.keys(), (name, sorted(state), sorted(expected))
        samples = [
            asyncio.run(_runner_seconds(name, pipeline, inputs, sizes.overhead_turns, None)) for _ in range(sizes.runs)
        ]
        results[name] = Stat.of(samples)

    for peer, build in (("langgraph", langgraph_turn), ("haystack", haystack_turn)):
        fn = build(pipeline, ctx)
        if fn is None:
            results[peer] = None
            continue
        fn(inputs)  # first call builds caches; it is not what a turn costs
        call = functools.partial(fn, inputs)
        results[peer] = Stat.of([_timed(call, sizes.peer_turns) for _ in range(sizes.runs)])

    # The recorder: the same turns with every node's input, output and meta written (snapshot=all).
    recorder_runs: dict[str, list[float]] = {"caller": [], "flushed": [], "p99_call": [], "max_call": [], "disk": []}
    for _ in range(sizes.runs):
        with tempfile.TemporaryDirectory(prefix="flowllm-bench-rec-") as folder:
            recorder = Recorder(folder, snapshot="all")
            timed = TimedObserver(recorder)
            gc.collect()
            t0 = time.perf_counter()
            asyncio.run(_turns_with(pipeline, inputs, sizes.recorder_turns, timed))
            caller = time.perf_counter() - t0
            recorder.close()
            flushed = time.perf_counter() - t0
            files = sum(1 for _ in Path(folder).rglob("*.json"))
            recorder_runs["disk"].append(raw_file_seconds(Path(folder) / "raw", files))
        calls = sorted(timed.calls)
        recorder_runs["caller"].append(caller / sizes.recorder_turns)
        recorder_runs["flushed"].append(flushed / sizes.recorder_turns)
        recorder_runs["p99_call"].append(calls[int(len(calls) * 0.99)])
        recorder_runs["max_call"].append(calls[-1])
    results["recorder"] = {k: Stat.of(v) for k, v in recorder_runs.items()}
    results["files_per_turn"] = files / sizes.recorder_turns
    results["payload_bytes"] = _payload_bytes(pipeline, inputs)
    return results


async def _turns_with(pipeline: Pipeline, inputs: dict[str, Any], turns: int, observer: NodeObserver) -> None:
    runner = make_runner("graph")
    for turn in range(turns):
        await runner.run(pipeline, inputs, TurnContext(task_id="bench", turn=turn + 1), observer)


def raw_file_seconds(folder: Path, count: int, size: int = 2048) -> float:
    """This disk's own pace: seconds per file to create ``count`` files atomically (temp + rename) from a plain
    loop, 3 to a folder like the recorder's; the reference for the recorder's "until on disk" figure."""
    data = b"x" * size
    t0 = time.perf_counter()
    for i in range(count):
        sub = folder / str(i // 3)
        if i % 3 == 0:
            sub.mkdir(parents=True)
        atomic_write(sub / f"{i}.json", data)
    return (time.perf_counter() - t0) / count


def _payload_bytes(pipeline: Pipeline, inputs: dict[str, Any]) -> int:
    """Bytes the recorder writes for one turn of these payloads (input, output and meta of every node)."""
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-size-") as folder:
        with Recorder(folder, snapshot="all") as recorder:
            asyncio.run(_turns_with(pipeline, inputs, 1, recorder))
        return sum(p.stat().st_size for p in Path(folder).rglob("*.json"))


def _us(stat: Stat) -> Stat:
    return stat.scaled(1e6)


def section(results: dict[str, Any]) -> Section:
    plain_node = _us(results["plain"]).scaled(1 / NODES)
    rows = []
    per_node: dict[str, Stat] = {}
    for name in ("plain", *RUNNERS, "langgraph", "haystack"):
        stat = results[name]
        label = {
            "plain": "plain Python loop (reference)",
            "langgraph": f"LangGraph {version_of('langgraph') or ''} StateGraph.invoke",
            "haystack": f"Haystack {version_of('haystack-ai') or ''} Pipeline.run",
        }.get(name, f"flowllm runner={name}")
        if stat is None:
            rows.append([label, "not installed", "-", "-"])
            continue
        turn_us = _us(stat)
        node_us = turn_us.scaled(1 / NODES)
        per_node[name] = node_us
        overhead = node_us.median - plain_node.median
        ratio = node_us.median / plain_node.median
        rows.append(
            [label, turn_us.fmt(1), node_us.fmt(2), f"{overhead:,.2f}" if name != "plain" else "-", f"{ratio:,.0f}x"]
        )
    table = md_table(["engine", "us per turn (7 nodes)", "us per node", "overhead us/node vs plain", "vs plain"], rows)

    rec = results["recorder"]
    base_node = per_node["graph"].median
    caller_node = rec["caller"].scaled(1e6 / NODES)
    flushed_node = rec["flushed"].scaled(1e6 / NODES)
    rec_caller = caller_node.median - base_node
    rec_flushed = flushed_node.median - base_node
    files_per_node = results["files_per_turn"] / NODES
    disk_node = rec["disk"].scaled(1e6 * files_per_node)
    rec_table = md_table(
        ["recorder (snapshot=all, runner=graph)", "us per node", "recorder's share us/node"],
        [
            ["on the event loop (serialise, hand to the writer)", caller_node.fmt(1), f"{rec_caller:,.1f}"],
            ["until every file is on disk (flush included)", flushed_node.fmt(1), f"{rec_flushed:,.1f}"],
            [f"this disk alone: {files_per_node:.0f} files created atomically by a plain loop", disk_node.fmt(1), "-"],
            ["one on_node call, 99th percentile", _us(rec["p99_call"]).fmt(1), "-"],
            ["one on_node call, longest", _us(rec["max_call"]).fmt(0), "-"],
        ],
    )

    targets = []
    for name in RUNNERS:
        over = per_node[name].median - plain_node.median
        targets.append(
            Target(
                f"overhead per node, {name}", f"<= {TARGET_US[name]:g} us", f"{over:,.2f} us", over <= TARGET_US[name]
            )
        )
    peers = [per_node[p].median for p in ("langgraph", "haystack") if p in per_node]
    slowest = max(per_node[r].median for r in RUNNERS)
    if peers:
        lead = min(peers) / slowest
        targets.append(
            Target(
                "flowllm's slowest runner vs the faster peer",
                f">= {PEER_LEAD:g}x ahead",
                f"{lead:,.0f}x",
                lead >= PEER_LEAD,
            )
        )
    else:
        targets.append(Target("flowllm vs LangGraph and Haystack", f">= {PEER_LEAD:g}x ahead", "not installed", None))
    targets.append(
        Target(
            "recorder per node, on the event loop",
            f"<= {RECORDER_TARGET_US:g} us",
            f"{rec_caller:,.1f} us",
            rec_caller <= RECORDER_TARGET_US,
        )
    )

    intro = f"""
The seven nodes of `conf/pipeline/agent_turn.yaml` with trivial bodies (each returns constant outputs), wired by
flowllm's own graph building; recorder off unless said. "us per node" is a turn's time over 7; the overhead is
that minus the plain loop's. Each cell: median (min-max) of {results["plain"].runs} runs. The recorder rows write
each node's input, output and meta (about {results["payload_bytes"] / 1024:,.0f} KB per turn, shaped like turn 2 of the
bundled sample) to a temporary folder.
"""
    disk_ratio = flushed_node.median / disk_node.median if disk_node.median else float("nan")
    notes = [
        "The recorder serialises on the caller (so a later mutation cannot change what was recorded) and hands "
        "the bytes to one background writer thread: the event loop never waits for the disk. Its cost on the loop "
        "is the first recorder row (the target). Writing 3 files per node atomically is bound by how fast the "
        f"disk creates files: the recorder's total is {disk_ratio:.2f}x what a bare loop of `atomic_write` "
        "calls takes for the same number of files on the same disk (third row), so there the disk, not Python, "
        "sets the pace. In a real run the model's latency hides this: the writer drains while the turn waits."
    ]
    return Section(
        "Engine overhead per node",
        intro,
        [table, rec_table],
        notes,
        targets,
        data={"per_node_us": {k: v.median for k, v in per_node.items()}, "recorder_us": rec_flushed},
    )


def run(sizes: Sizes) -> Section:
    return section(measure(sizes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, not a measurement)")
    args = parser.parse_args(argv)
    print(run(Sizes.quick() if args.quick else Sizes.full()).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
