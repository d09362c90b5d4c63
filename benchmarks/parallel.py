"""Parallel tool dispatch: one turn whose reply holds k tool calls of a fixed duration, per runner.

The whole turn runs for real: the seven nodes of ``conf/pipeline/agent_turn.yaml``, the Anthropic SDK against the
emulator (no added latency), the parser and repair reading k calls, and ``dispatch_tools`` calling a tool that
waits ``tool_seconds`` (in process, so the figure is the engine's dispatch, not process start-up). The ideal is
one tool's duration under ``graph_parallel`` and k of them one after another under ``legacy``.

    python -m benchmarks.parallel [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Section, Sizes, Stat, Target, md_table

RATIO_TARGET = 1.1
RUNNERS = ("legacy", "graph_parallel")


async def _turn_seconds(k: int, runner_name: str, sizes: Sizes, work_dir: Path) -> list[float]:
    from benchmarks.stack import InProcessTools, compose, fanout_script, write_workload
    from flowllm.agent.loop import build_system_prompt
    from flowllm.core.types import user_message
    from flowllm.engine import TurnContext
    from flowllm.providers import open_provider
    from flowllm.setup.build import prepare

    work = write_workload(work_dir / f"{runner_name}-{k}", 1, fanout_script((k,), sizes.tool_seconds), "done")
    cfg = compose(
        [
            f"dataset.path={work.dataset}",
            f"provider.emulator_script={work.script}",
            f"runner={runner_name}",
            "recorder.snapshot=none",
        ]
    )
    parts = prepare(cfg)
    tools = InProcessTools()
    specs = await tools.list_tools()
    samples = []
    async with open_provider(parts.provider_cfg, resolve=parts.providers) as provider:
        system = build_system_prompt("Use the tools.", specs, provider.tool_protocol)
        inputs = {"messages": [user_message("Run the tools.")], "system": system, "tools": specs}
        for i in range(sizes.runs + 1):
            ctx = TurnContext(task_id=f"k{k}", turn=1, provider=provider, tools=tools)
            t0 = time.perf_counter()
            state = await parts.runner.run(parts.pipeline, inputs, ctx)
            seconds = time.perf_counter() - t0
            results = state["tool_results"]
            assert len(results) == k and all(r.content == "slept" for r in results), results
            if i:  # the first turn opens the HTTP connection: not part of a turn's cost
                samples.append(seconds)
    return samples


def measure(sizes: Sizes) -> dict[Any, Stat]:
    results: dict[Any, Stat] = {}
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-par-") as folder:
        for k in sizes.fanout_k:
            for runner in RUNNERS:
                results[(k, runner)] = Stat.of(asyncio.run(_turn_seconds(k, runner, sizes, Path(folder))))
    return results


def section(results: dict[Any, Stat], sizes: Sizes) -> Section:
    tool_ms = sizes.tool_seconds * 1000
    rows = []
    for k in sizes.fanout_k:
        par = results[(k, "graph_parallel")].scaled(1000)
        leg = results[(k, "legacy")].scaled(1000)
        rows.append(
            [
                k,
                par.fmt(1),
                par.scaled(1 / tool_ms).fmt(3, "x"),
                leg.fmt(1),
                leg.scaled(1 / (k * tool_ms)).fmt(3, "x"),
                f"{leg.median / par.median:.1f}x",
            ]
        )
    table = md_table(
        [
            "k tools",
            "graph_parallel ms",
            f"over ideal ({tool_ms:.0f} ms)",
            "legacy ms",
            "legacy over k x tool",
            "speed-up",
        ],
        rows,
    )
    top = max(sizes.fanout_k)
    ratio = results[(top, "graph_parallel")].median * 1000 / tool_ms
    intro = f"""
One whole turn (model call through the SDK to the emulator, parse, repair, dispatch) whose reply asks for k tools
that each take {tool_ms:.0f} ms. Under `graph_parallel` the k calls run concurrently (ideal: {tool_ms:.0f} ms); under
`legacy` one after another (ideal: k x {tool_ms:.0f} ms). The ratios include the model call and parsing k
calls, which is why they sit a little above 1. Median (min-max) of {sizes.runs} turns after a warm-up turn.
"""
    targets = [
        Target(f"graph_parallel at k = {top}", f"<= {RATIO_TARGET}x ideal", f"{ratio:.3f}x", ratio <= RATIO_TARGET)
    ]
    return Section("Parallel tool dispatch", intro, [table], [], targets, data={"ratio_top": ratio})


def run(sizes: Sizes) -> Section:
    return section(measure(sizes), sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, not a measurement)")
    args = parser.parse_args(argv)
    print(run(Sizes.quick() if args.quick else Sizes.full()).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
