"""Concurrency at scale: N tasks of T turns at once, against the emulator with a fixed latency per model call.

Each level runs in a fresh Python process (so its peak memory is its own) through the real stack: Hydra config,
``prepare``, the Anthropic SDK over HTTP, the experiment runner, the turn graph under ``graph_parallel``, the
parser and repair, tools in process. The emulator runs in its own process too, as a model server would: its CPU
is not flowllm's. The ideal is T x latency (every task's turns back to back, all tasks overlapping), so
wall / ideal is what flowllm and the SDK add on top of the model's latency.

Each level also runs over two worker processes, as ``experiment.workers=2`` does: the same stack in two fresh
processes, each with its share of the tasks (and of ``max_concurrent``), released together once both have
started (imports and config, which the one-process column does not count either); the wall time is the span
from the first worker's first task to the last worker's last result.

    python -m benchmarks.concurrency [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Section, Sizes, Stat, Target, md_table, python, subprocess_env

RATIO_TARGET = 1.25
WORKERS = 2  # the second column: tasks over this many processes
SPEEDUP_TARGET = 1.7  # workers=2 against workers=1 at the top level, on two cores
MEMORY_TARGET_MB = 1024.0


def _peak_rss_mb() -> float:
    """This process's peak resident memory.

    Linux's VmHWM first: ``ru_maxrss`` survives ``exec``, so a child started by a big parent would report the
    parent's peak (the benchmark's own process holds LangGraph and Haystack by then).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024


def child(
    tasks: int, turns: int, latency_s: float, base_url: str, folder: Path, snapshot: str, barrier: bool = False
) -> dict[str, Any]:
    """One level, in this process: returns the figures as a dict (printed as JSON by ``--child``)."""
    from benchmarks.stack import compose, multi_turn_answer, multi_turn_script, run_experiment, write_workload

    work = write_workload(folder / "work", tasks, multi_turn_script(turns, latency_s), multi_turn_answer(turns))
    overrides = [
        f"dataset.path={work.dataset}",
        "provider.emulator_script=null",
        f"provider.base_url={base_url}",
        "runner=graph_parallel",
        f"experiment.max_concurrent={tasks}",
        f"agent.max_turns={turns + 1}",
        f"recorder.snapshot={snapshot}",
        "experiment.resume=false",
        "progress=false",
    ]
    cfg = compose(overrides)
    if barrier:  # one of several workers: start together, once every one has imported and composed
        print("ready", flush=True)
        sys.stdin.readline()
    before = _peak_rss_mb()
    figures = asyncio.run(run_experiment(cfg, folder / "run"))
    ended_at = time.time()  # the span of several worker processes is measured on the wall clock
    return {
        "ended_at": ended_at,
        "tasks": tasks,
        "wall_s": figures.wall_s,
        "completed": figures.completed,
        "correct": figures.correct,
        "turns": figures.turns,
        "errors": figures.errors,
        "rss_before_mb": before,
        "rss_peak_mb": _peak_rss_mb(),
        "cpu_s": figures.cpu_s,
    }


class EmulatorProcess:
    """``python -m flowllm.emulator`` on a free port, for as long as the ``with`` block lasts."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> EmulatorProcess:
        self.proc = subprocess.Popen(
            [python(), "-m", "flowllm.emulator", "--script", str(self.script)],
            stdout=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not found:
            self.__exit__()
            raise RuntimeError(f"the emulator did not start: {line!r}")
        self.base_url = found.group(0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _child_command(tasks: int, sizes: Sizes, base_url: str, folder: str, snapshot: str) -> list[str]:
    return [
        python(),
        "-m",
        "benchmarks.concurrency",
        "--child",
        "--tasks",
        str(tasks),
        "--turns",
        str(sizes.concurrency_turns),
        "--latency",
        str(sizes.latency_s),
        "--base-url",
        base_url,
        "--folder",
        folder,
        "--snapshot",
        snapshot,
    ]


def run_level(tasks: int, sizes: Sizes, base_url: str, snapshot: str = "none") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-conc-") as folder:
        if sizes.in_process:
            return child(tasks, sizes.concurrency_turns, sizes.latency_s, base_url, Path(folder), snapshot)
        cmd = _child_command(tasks, sizes, base_url, folder, snapshot)
        out = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=1800, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"concurrency level {tasks} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_level_workers(tasks: int, sizes: Sizes, base_url: str, workers: int, snapshot: str = "none") -> dict[str, Any]:
    """``tasks`` over ``workers`` processes started together, each its share (always separate processes)."""
    from flowllm.experiment.workers import share

    count = min(workers, tasks)
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-conc-w-") as folder:
        procs = []
        for index in range(count):
            sub = Path(folder) / str(index)
            sub.mkdir()
            cmd = [*_child_command(share(tasks, index, count), sizes, base_url, str(sub), snapshot), "--barrier"]
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=subprocess_env(),
                )
            )
        for proc in procs:  # every worker has started (imports, config) before any runs a task
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            if ready.strip() != "ready":
                raise RuntimeError(
                    f"a worker of level {tasks} did not start: {ready!r} {proc.communicate()[1][-3000:]}"
                )
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outs = [proc.communicate(timeout=1800) for proc in procs]
    parts = []
    for proc, (stdout, stderr) in zip(procs, outs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"concurrency level {tasks}, {count} workers, failed:\n{stderr[-3000:]}")
        parts.append(json.loads(stdout.strip().splitlines()[-1]))
    started = min(p["ended_at"] - p["wall_s"] for p in parts)
    return {
        "tasks": tasks,
        "workers": count,
        "wall_s": max(p["ended_at"] for p in parts) - started,
        "completed": sum(p["completed"] for p in parts),
        "correct": sum(p["correct"] for p in parts),
        "turns": sum(p["turns"] for p in parts),
        "errors": [e for p in parts for e in p["errors"]],
        "rss_peak_mb": sum(p["rss_peak_mb"] for p in parts),  # the processes' peaks added up
        "cpu_s": sum(p["cpu_s"] for p in parts),
    }


def measure(sizes: Sizes) -> dict[str, Any]:
    from benchmarks.stack import multi_turn_script, with_latency  # noqa: F401  (imported for the script only)

    results: dict[str, Any] = {"levels": {}, "workers": {}}
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-emu-") as folder:
        import yaml

        script = Path(folder) / "script.yaml"
        script.write_text(yaml.safe_dump(multi_turn_script(sizes.concurrency_turns, sizes.latency_s)))
        with EmulatorProcess(script) as emulator:
            for tasks in sizes.concurrency:
                runs = [run_level(tasks, sizes, emulator.base_url) for _ in range(sizes.runs)]
                results["levels"][tasks] = runs
                results["workers"][tasks] = [
                    run_level_workers(tasks, sizes, emulator.base_url, WORKERS) for _ in range(sizes.runs)
                ]
    return results


def section(results: dict[str, Any], sizes: Sizes) -> Section:
    ideal = sizes.concurrency_turns * sizes.latency_s
    rows = []
    ratios: dict[int, Stat] = {}
    peaks: dict[int, float] = {}
    speedups: dict[int, float] = {}
    smallest = min(results["levels"])
    floor = Stat.of([r["rss_peak_mb"] for r in results["levels"][smallest]]).median
    for tasks, runs in results["levels"].items():
        wall = Stat.of([r["wall_s"] for r in runs])
        ratio = wall.scaled(1 / ideal)
        ratios[tasks] = ratio
        tps = Stat.of([tasks / r["wall_s"] for r in runs])
        peak = Stat.of([r["rss_peak_mb"] for r in runs])
        peaks[tasks] = peak.median
        ok = all(r["completed"] == r["correct"] == tasks for r in runs)
        spread = results["workers"][tasks]
        wall_w = Stat.of([r["wall_s"] for r in spread])
        speedups[tasks] = wall.median / wall_w.median
        ok_w = all(r["completed"] == r["correct"] == tasks for r in spread)
        rows.append(
            [
                tasks,
                wall.fmt(2),
                ratio.fmt(2, "x"),
                tps.fmt(1),
                f"{Stat.of([r['cpu_s'] / r['turns'] * 1000 for r in runs]).median:.1f}",
                peak.fmt(0),
                f"{(peak.median - floor) / (tasks - smallest) * 1024:,.0f}" if tasks > smallest else "-",
                wall_w.fmt(2),
                wall_w.scaled(1 / ideal).fmt(2, "x"),
                f"{Stat.of([r['cpu_s'] / r['turns'] * 1000 for r in spread]).median:.1f}",
                f"{speedups[tasks]:.2f}x",
                # Last, as every end-to-end table: "all" when both runs got every task right.
                "all"
                if ok and ok_w
                else f"1 worker {min(r['correct'] for r in runs)}/{tasks}, {WORKERS} workers "
                f"{min(r['correct'] for r in spread)}/{tasks} (errors: {(runs[0]['errors'] or spread[0]['errors'])})",
            ]
        )
    table = md_table(
        [
            "tasks at once",
            "wall s",
            "wall / ideal",
            "tasks/s",
            "flowllm CPU ms per turn",
            "peak RSS MB",
            f"KB per task above {smallest} task{'s' if smallest > 1 else ''}",
            f"wall s, {WORKERS} workers",
            f"wall / ideal, {WORKERS} workers",
            f"CPU ms per turn, {WORKERS} workers",
            f"{WORKERS} workers vs 1",
            "correct",
        ],
        rows,
    )
    top = max(results["levels"])
    targets = [
        Target(
            f"wall / ideal at {top} tasks",
            f"<= {RATIO_TARGET}x",
            f"{ratios[top].median:.2f}x",
            ratios[top].median <= RATIO_TARGET,
        ),
        Target(
            f"peak memory at {top} tasks",
            f"< {MEMORY_TARGET_MB:,.0f} MB",
            f"{peaks[top]:,.0f} MB",
            peaks[top] < MEMORY_TARGET_MB,
        ),
        Target(
            f"{WORKERS} workers against 1 at {top} tasks",
            f">= {SPEEDUP_TARGET}x faster",
            f"{speedups[top]:.2f}x",
            speedups[top] >= SPEEDUP_TARGET,
        ),
    ]
    intro = f"""
Tasks of {sizes.concurrency_turns} turns each ({sizes.concurrency_turns - 1} with a calculator call, then the answer),
all started at once (`experiment.max_concurrent` = tasks), `runner=graph_parallel`,
`recorder.snapshot=none`, the emulator answering every call {sizes.latency_s * 1000:.0f} ms late (its `delay` fault
at rate 1). Ideal: {sizes.concurrency_turns} x {sizes.latency_s * 1000:.0f} ms = {ideal:.2f} s whatever the number of
tasks. Each level runs {sizes.runs} times in a fresh process; cells are median (min-max). Peak RSS is the flowllm
process's (the emulator runs in its own); the growth per task is measured from the smallest level up.
"""
    runs_top = results["levels"][top]
    cpu_top = Stat.of([r["cpu_s"] for r in runs_top]).median
    wall_top = Stat.of([r["wall_s"] for r in runs_top]).median
    notes = [
        f"At {top} tasks the flowllm process is busy for {cpu_top / wall_top:.0%} of the wall time "
        f"({cpu_top:.1f} s of CPU in {wall_top:.1f} s): the run is bound by the CPU one Python process spends per "
        "model call, not by waiting. That CPU is mostly the SDK's HTTP stack, not the engine (whose whole turn "
        "graph costs tens of microseconds, see above): a profile shows the Anthropic SDK building and parsing "
        "each request and reply (pydantic models, header handling) and httpcore2's connection pool, which checks "
        "every connection it holds on each request. flowllm spreads tasks over 16 SDK clients "
        "(`flowllm/providers/factory.py`, CLIENT_SHARDS) so each pool stays small: with one client this level took "
        "14.7 s instead of about 9-10 s. The 1.25x target would need about 0.2 ms of CPU per call, an order of "
        "magnitude below what the official SDK costs here."
    ]
    return Section(
        "Concurrency: tasks at once against a 100 ms model",
        intro.strip(),
        [table],
        notes,
        targets,
        data={"ratio": {k: v.median for k, v in ratios.items()}, "peak_mb": peaks, "workers_speedup": speedups},
    )


def run(sizes: Sizes) -> Section:
    return section(measure(sizes), sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, not a measurement)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tasks", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--turns", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--latency", type=float, default=0.1, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--folder", default="", help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        t0 = time.perf_counter()
        figures = child(
            args.tasks, args.turns, args.latency, args.base_url, Path(args.folder), args.snapshot, args.barrier
        )
        figures["process_s"] = time.perf_counter() - t0
        print(json.dumps(figures))
        return 0
    print(run(Sizes.quick() if args.quick else Sizes.full()).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
