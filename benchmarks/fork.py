"""Fork at divergence against a full live re-run: a changed repair chain, on the replay benchmark's saved run.

The saved run is the replay benchmark's workload (tasks x turns, a calculator call per turn, then the answer),
made live through the emulator with ``repair=full``, except that every fourth task writes its turn-2 call with
single-quoted JSON, which only the lenient repair stages read. Then the question a user asks: what does
``repair=strict`` change? Answered twice, both through the emulator with the same model latency:

* a full live re-run with ``repair=strict`` (every turn of every task calls the model);
* the saved run forked with ``repair=strict`` (``provider=replay provider.fork=live``): the tasks strict does
  not touch replay for free, the others go live from the turn whose request changed.

Both score every task; the benchmark checks that they agree task by task, and reports wall time, model calls
and what a fork saved. Tools are served in process (``benchmarks/stack.py``), as in the replay benchmark.

    python -m benchmarks.fork [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from benchmarks.common import ROOT, Section, Sizes, Stat, Target, md_table
from benchmarks.stack import MATH, compose, multi_turn_answer, open_in_process_tools, tool_call_text, write_workload
from flowllm.rundir.results import RunSummary

LIVE_PROVIDER = "bench_live"
EVERY = 4  # every fourth task writes its turn-2 call in a form only the lenient repair stages read
MAX_CONCURRENT = 16


def lenient_call(turn: int) -> str:
    """A calculator call with single-quoted JSON arguments: read by ``repair=full``, failed by ``repair=strict``."""
    text = tool_call_text(*MATH, {"expression": f"2**{turn} + {turn}"})
    return text.replace('{"expression": ', "{'expression': ").replace(f'"2**{turn} + {turn}"', f"'2**{turn} + {turn}'")


def fork_script(task_ids: tuple[str, ...], turns: int, latency_s: float) -> dict[str, Any]:
    def replies(lenient: bool) -> list[dict[str, Any]]:
        out = [
            {
                "text": f"Step {t}: let me compute.\n\n"
                + (lenient_call(t) if lenient and t == 2 else tool_call_text(*MATH, {"expression": f"2**{t} + {t}"}))
            }
            for t in range(1, turns)
        ]
        out.append({"text": "The result is ${last_tool_result}.\n\n\\boxed{${last_tool_result}}"})
        return out

    script: dict[str, Any] = {
        "default": replies(False),
        "tasks": {t: replies(True) for i, t in enumerate(task_ids) if i % EVERY == 0},
    }
    if latency_s > 0:
        script["faults"] = {"rules": [{"fault": "delay", "delay_s": latency_s}]}
    return script


@dataclass
class RunFigures:
    wall_s: float
    cpu_s: float
    correct: dict[str, bool | None]
    fork_turns: list[int]  # the turns at which forked tasks went live (a fork only)
    calls: int  # model calls billed in the run's ledger
    cost_usd: float | None
    summary: RunSummary


async def run_one(overrides: list[str], run_dir: Path) -> RunFigures:
    """One run as ``python -m flowllm`` makes it (prepare, the provider with its ledger, the experiment, the
    summary), with the tools in process; the wall time covers the tasks only."""
    from flowllm.engine import Recorder
    from flowllm.providers import UsageLedger, open_provider
    from flowllm.rundir.layout import RunLayout
    from flowllm.setup.build import build_experiment, prepare, run_summary

    cfg = compose(overrides)
    parts = prepare(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save({k: v for k, v in cfg.items() if k != "hydra"}, run_dir / ".hydra" / "config.yaml")
    recorder = Recorder(run_dir, snapshot=cfg.recorder.snapshot)
    ledger = UsageLedger(RunLayout(run_dir).ledger, prices=parts.prices)
    try:
        async with open_provider(parts.provider_cfg, ledger=ledger, resolve=parts.providers) as provider:
            experiment = build_experiment(cfg, parts, provider, recorder, open_tools=open_in_process_tools)
            t0, cpu0 = time.perf_counter(), time.process_time()
            result = await experiment.run(parts.tasks)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await asyncio.to_thread(recorder.close)
        ledger.close()
    summary = run_summary(cfg, parts, result, run_dir, wall_seconds=wall)
    return RunFigures(
        wall,
        cpu,
        {o.task_id: o.correct for o in result.outcomes},
        sorted({int(o.replay["turn"]) for o in result.outcomes if o.replay and o.replay.get("turn") is not None}),
        int(summary.providers["calls"]),
        summary.providers.get("cost_usd"),
        summary,
    )


def measure(sizes: Sizes) -> dict[str, Any]:
    tasks, turns, latency = sizes.replay_tasks, sizes.replay_turns, sizes.latency_s
    runs = max(1, min(sizes.runs, 3))
    ids = tuple(f"t{i:05d}" for i in range(tasks))
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-fork-") as tmp:
        folder = Path(tmp)
        work = write_workload(folder / "work", tasks, fork_script(ids, turns, latency), multi_turn_answer(turns))
        assert work.task_ids == ids
        # provider.live names a provider config: the emulator with this workload's script.
        providers = folder / "providers"
        providers.mkdir()
        live = OmegaConf.load(ROOT / "flowllm" / "conf" / "provider" / "offline.yaml")
        live.pop("defaults", None)
        live.emulator_script = str(work.script)
        OmegaConf.save(live, providers / f"{LIVE_PROVIDER}.yaml")
        common = [
            f"dataset.path={work.dataset}",
            "runner=graph_parallel",
            f"experiment.max_concurrent={MAX_CONCURRENT}",
            f"agent.max_turns={turns + 1}",
            "recorder.snapshot=all",
            "experiment.resume=false",
            "progress=false",
        ]
        saved_dir = folder / "saved"
        saved = asyncio.run(run_one([*common, f"provider.emulator_script={work.script}", "repair=full"], saved_dir))
        if not all(saved.correct.values()) or len(saved.correct) != tasks:
            raise RuntimeError(f"the saved run did not solve every task: {sum(map(bool, saved.correct.values()))}")
        results: dict[str, Any] = {"tasks": tasks, "turns": turns, "latency_s": latency, "saved_calls": saved.calls}
        live_runs: list[dict[str, Any]] = []
        fork_runs: list[dict[str, Any]] = []
        for i in range(runs):
            strict = asyncio.run(
                run_one([*common, f"provider.emulator_script={work.script}", "repair=strict"], folder / f"live-{i}")
            )
            fork = asyncio.run(
                run_one(
                    [
                        *common,
                        "provider=replay",
                        f"provider.run_dir={saved_dir}",
                        "provider.fork=live",
                        f"provider.live={LIVE_PROVIDER}",
                        f"provider.config_dir={providers}",
                        "repair=strict",
                    ],
                    folder / f"fork-{i}",
                )
            )
            agree = sum(1 for t in ids if strict.correct.get(t) == fork.correct.get(t))
            live_runs.append({"wall_s": strict.wall_s, "cpu_s": strict.cpu_s, "calls": strict.calls})
            replay = fork.summary.replay
            assert replay is not None, "a fork's summary has a replay block"
            fork_runs.append(
                {
                    "wall_s": fork.wall_s,
                    "cpu_s": fork.cpu_s,
                    "calls": fork.calls,
                    "agree": agree,
                    "exact": replay.exact,
                    "forked": replay.forked,
                    "fork_turns": fork.fork_turns,
                    "accuracy": fork.summary.accuracy,
                    "live_accuracy": strict.summary.accuracy,
                    "fork": fork.summary.fork.to_dict() if fork.summary.fork else None,
                }
            )
        results["live"] = live_runs
        results["fork"] = fork_runs
    return results


def section(results: dict[str, Any], sizes: Sizes) -> Section:
    live, fork = results["live"], results["fork"]
    live_wall = Stat.of([r["wall_s"] for r in live])
    fork_wall = Stat.of([r["wall_s"] for r in fork])
    live_cpu = Stat.of([r["cpu_s"] for r in live])
    fork_cpu = Stat.of([r["cpu_s"] for r in fork])
    first = fork[0]
    tasks = results["tasks"]
    rows = [
        [
            "full live re-run, repair=strict",
            live_wall.fmt(2),
            live_cpu.fmt(2),
            f"{live[0]['calls']:,}",
            f"{first['live_accuracy']:.1%}",
            "-",
        ],
        [
            "fork of the saved run, repair=strict",
            fork_wall.fmt(2),
            fork_cpu.fmt(2),
            f"{first['calls']:,}",
            f"{first['accuracy']:.1%}",
            f"{first['exact']} exact, {first['forked']} forked",
        ],
    ]
    table = md_table(["run", "wall s", "CPU s", "model calls", "accuracy", "verdicts"], rows)
    agree = min(r["agree"] for r in fork)
    saved = first["fork"]
    intro = f"""
`python -m benchmarks.fork`: the replay benchmark's saved run ({tasks} tasks x {results["turns"]} turns, made
live with `repair=full`; every {EVERY}th task writes its turn-2 call in single-quoted JSON, which only the lenient
repair stages read) asked "what does `repair=strict` change?" twice, against the emulator answering each call
{results["latency_s"] * 1000:.0f} ms late, {MAX_CONCURRENT} tasks at once: a full live re-run, and the saved run
forked (`provider=replay provider.fork=live`). Wall time covers the tasks; median (min-max) of {len(fork)} runs.
"""
    targets = [
        Target("fork vs live re-run: tasks scored alike", f"{tasks} of {tasks}", f"{agree} of {tasks}", agree == tasks),
        Target(
            "fork vs live re-run: model calls",
            "fewer",
            f"{first['calls']:,} vs {live[0]['calls']:,}",
            first["calls"] < live[0]["calls"],
        ),
    ]
    notes = [
        f"The fork's summary states what it saved: {saved['live_calls']:,} live calls for "
        f"${saved['live_cost_usd'] or 0:.4f}, against {saved['full_rerun_calls']:,} calls for "
        f"${saved['full_rerun_cost_usd'] or 0:.4f} in the saved run's ledger: ${saved['saved_usd'] or 0:.4f} and "
        f"{saved['saved_calls']:,} calls saved (emulator prices). The exact tasks were billed nothing.",
        f"Wall time: {live_wall.median / max(fork_wall.median, 1e-9):.1f}x shorter for the fork. A forked task "
        f"replays its turns up to the first whose request changed (turn {', '.join(map(str, first['fork_turns']))} "
        "here: the turn after the call strict fails), each a saved reply read from disk with no model latency, and "
        "calls the model from there; an exact task calls it never.",
    ]
    return Section(
        "Fork at divergence",
        intro,
        [table],
        notes,
        targets,
        data={"live_wall_s": live_wall.median, "fork_wall_s": fork_wall.median, "agree": agree},
    )


def run(sizes: Sizes) -> Section:
    return section(measure(sizes), sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, not a measurement)")
    parser.add_argument("--json", action="store_true", help="print the raw figures instead of the section")
    args = parser.parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    results = measure(sizes)
    print(json.dumps(results, indent=1) if args.json else section(results, sizes).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
