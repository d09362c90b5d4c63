"""Replay throughput: turns per second re-processed from a saved run, on one core, recorder off and on.

A run of ``tasks x turns`` turns is made first (offline, through the emulator, every node recorded). It is then
re-run with ``provider=replay provider.run_dir=<that run>``: each model call is answered from the saved
``call_model`` output, and everything after it runs for real (normalize, parse, repair, dispatch to the
in-process calculator, the agent loop, scoring). Each replay runs in a fresh process pinned to one CPU (where the
OS allows it), so the figure is what one core does; the recorder's writer thread shares that core.

    python -m benchmarks.replay [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Section, Sizes, Stat, Target, md_table, python, subprocess_env

TARGET_TPS = 5000.0
SNAPSHOTS = ("none", "all")


def _pin_to_one_core() -> str:
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity on this OS)"
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


def child(source: Path, dataset: Path, snapshot: str, folder: Path, turns: int, pin: bool = True) -> dict[str, Any]:
    """One replay in this process (pinned to one core first, unless ``pin`` is false); returns its figures."""
    pinned = _pin_to_one_core() if pin else "not pinned (run inside the calling process)"
    from benchmarks.stack import compose, run_experiment

    cfg = compose(
        [
            "provider=replay",
            f"provider.run_dir={source}",
            f"dataset.path={dataset}",
            "runner=graph_parallel",
            "experiment.max_concurrent=8",
            f"agent.max_turns={turns + 1}",
            f"recorder.snapshot={snapshot}",
            "experiment.resume=false",
            "progress=false",
        ]
    )
    figures = asyncio.run(run_experiment(cfg, folder / f"replay-{snapshot}"))
    return {
        "wall_s": figures.wall_s,
        "gc_s": figures.gc_s,
        "turns": figures.turns,
        "correct": figures.correct,
        "completed": figures.completed,
        "errors": figures.errors,
        "pinned": pinned,
    }


def make_source(folder: Path, sizes: Sizes) -> tuple[Path, Path, int]:
    """The saved run to replay: returns its folder, its dataset and its number of turns."""
    from benchmarks.stack import (
        compose,
        multi_turn_answer,
        multi_turn_script,
        run_experiment,
        workload_overrides,
        write_workload,
    )

    turns = sizes.replay_turns
    work = write_workload(folder / "work", sizes.replay_tasks, multi_turn_script(turns, 0.0), multi_turn_answer(turns))
    cfg = compose(workload_overrides(work, runner="graph_parallel", max_concurrent=16, turns=turns, snapshot="all"))
    run_dir = folder / "source"
    figures = asyncio.run(run_experiment(cfg, run_dir))
    if figures.correct != sizes.replay_tasks:
        raise RuntimeError(f"the run to replay did not complete: {figures}")
    return run_dir, work.dataset, figures.turns


def measure(sizes: Sizes) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-replay-") as tmp:
        folder = Path(tmp)
        source, dataset, turns = make_source(folder, sizes)
        results["source_turns"] = turns
        results["source_files"] = sum(1 for _ in (source / "tasks").rglob("*.json"))
        for snapshot in SNAPSHOTS:
            runs = []
            for i in range(sizes.runs):
                out_dir = folder / f"out-{snapshot}-{i}"
                if sizes.in_process:
                    runs.append(child(source, dataset, snapshot, out_dir, sizes.replay_turns, pin=False))
                    continue
                cmd = [
                    python(),
                    "-m",
                    "benchmarks.replay",
                    "--child",
                    "--source",
                    str(source),
                    "--dataset",
                    str(dataset),
                    "--snapshot",
                    snapshot,
                    "--folder",
                    str(out_dir),
                    "--turns",
                    str(sizes.replay_turns),
                ]
                out = subprocess.run(
                    cmd, capture_output=True, text=True, env=subprocess_env(), timeout=1800, check=False
                )
                if out.returncode != 0:
                    raise RuntimeError(f"replay ({snapshot}) failed:\n{out.stderr[-3000:]}")
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            results[snapshot] = runs
    return results


def section(results: dict[str, Any], sizes: Sizes) -> Section:
    rows = []
    tps: dict[str, Stat] = {}
    for snapshot in SNAPSHOTS:
        runs = results[snapshot]
        stat = Stat.of([r["turns"] / r["wall_s"] for r in runs])
        tps[snapshot] = stat
        ok = all(r["correct"] == sizes.replay_tasks for r in runs)
        rows.append(
            [
                f"recorder.snapshot={snapshot}",
                runs[0]["turns"],
                Stat.of([r["wall_s"] for r in runs]).fmt(2),
                stat.fmt(0),
                f"{1e6 / stat.median:,.0f}",
                "all" if ok else f"{min(r['correct'] for r in runs)} (errors: {runs[0]['errors']})",
            ]
        )
    table = md_table(["replay", "turns", "wall s", "turns/s", "us per turn", "tasks correct"], rows)
    intro = f"""
A saved run of {sizes.replay_tasks} tasks x {sizes.replay_turns} turns = {results["source_turns"]:,} turns
({results["source_files"]:,} JSON files) re-run with `provider=replay`: normalize, parse, repair, dispatch
(in-process calculator), agent loop and scoring for every turn, in one process {results["none"][0]["pinned"]}.
The wall time covers the tasks (not start-up). Median (min-max) of {sizes.runs} replays, each in a fresh process.
"""
    none = tps["none"].median
    targets = [
        Target(
            "replay, recorder off, one core",
            f">= {TARGET_TPS:,.0f} turns/s",
            f"{none:,.0f} turns/s",
            none >= TARGET_TPS,
        )
    ]
    notes = [
        "Where a replayed turn's time goes is the last column of the profile section: the saved reply is one "
        "directory scan and one `output.json` read away (`ReplayProvider.send` goes straight to "
        "`turn_NNN/NN_call_model` and compares the new request with the saved one by plain equality); the replay "
        "audit, which decides whether a task replayed exactly, serialises every node's output and compares it "
        "with the saved file (the recorder row, with the recorder off); the rest is the turn's own nodes, the "
        "engine, the agent loop and the experiment's per-task set-up (workspace folder, scoring).",
        f"With the recorder on, each turn writes {results['source_files'] // max(results['source_turns'], 1)} "
        "files atomically; on this machine's disk that, not Python, bounds the rate (see the recorder rows of the "
        "engine-overhead table for the disk's own pace).",
    ]
    return Section(
        "Replay throughput", intro, [table], notes, targets, data={"turns_per_s": {k: v.median for k, v in tps.items()}}
    )


def run(sizes: Sizes) -> Section:
    return section(measure(sizes), sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, not a measurement)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source", default="", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", default="", help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--folder", default="", help=argparse.SUPPRESS)
    parser.add_argument("--turns", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        t0 = time.perf_counter()
        figures = child(Path(args.source), Path(args.dataset), args.snapshot, Path(args.folder), args.turns)
        figures["process_s"] = time.perf_counter() - t0
        print(json.dumps(figures))
        return 0
    print(run(Sizes.quick() if args.quick else Sizes.full()).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
