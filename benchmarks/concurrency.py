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

Next to flowllm, at every level and in the same repetitions (interleaved, so a busy machine slows every column
alike): the floor, the same calls made by a minimal asyncio script of bare ``messages.create`` calls of the
Anthropic SDK (``benchmarks/floor.py``, no flowllm), and the peer, Inspect AI running the same tasks through its
OpenAI-compatible provider (``benchmarks/inspect_peer.py``), each in a fresh process against the same emulator.

    python -m benchmarks.concurrency [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Section,
    Sizes,
    Stat,
    Target,
    file_creation_us,
    md_table,
    peak_rss_mb,
    python,
    subprocess_env,
    version_of,
)

FLOOR_TARGET = 1.25  # flowllm's wall / ideal over the floor's, at FLOOR_LEVEL tasks
FLOOR_LEVEL = 500
CPU_TARGET = 1.25  # flowllm's CPU per turn over the floor's CPU per call, at FLOOR_LEVEL tasks (issue 47)
WORKERS = 2  # the second column: tasks over this many processes
SPEEDUP_TARGET = 1.7  # workers=2 against workers=1 at the top level, on two cores
MEMORY_TARGET_MB = 1024.0  # at the top level


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
    before = peak_rss_mb()
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
        "rss_peak_mb": peak_rss_mb(),
        "cpu_s": figures.cpu_s,
        "user_s": figures.user_s,
        "sys_s": figures.sys_s,
        "gc_s": figures.gc_s,
        # Folders and files the run's records made per task (each one an inode the kernel allocates).
        "entries_per_task": sum(1 for _ in (folder / "run" / "tasks").rglob("*")) / max(tasks, 1),
    }


class EmulatorProcess:
    """The emulator (``benchmarks/emulator_server.py``: sized for thousands of connections) on a free port, for as
    long as the ``with`` block lasts."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> EmulatorProcess:
        self.proc = subprocess.Popen(
            [python(), "-m", "benchmarks.emulator_server", str(self.script)],
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


def run_level(tasks: int, sizes: Sizes, base_url: str, scratch: Path, snapshot: str = "none") -> dict[str, Any]:
    """One flowllm run of ``tasks`` in a new folder under ``scratch`` (kept until the section ends: ``measure``)."""
    folder = tempfile.mkdtemp(prefix="conc-", dir=scratch)
    if sizes.in_process:
        return child(tasks, sizes.concurrency_turns, sizes.latency_s, base_url, Path(folder), snapshot)
    cmd = _child_command(tasks, sizes, base_url, folder, snapshot)
    out = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=1800, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"concurrency level {tasks} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_level_workers(
    tasks: int, sizes: Sizes, base_url: str, workers: int, scratch: Path, snapshot: str = "none"
) -> dict[str, Any]:
    """``tasks`` over ``workers`` processes started together, each its share (always separate processes)."""
    from flowllm.experiment.workers import share

    count = min(workers, tasks)
    folder = tempfile.mkdtemp(prefix="conc-w-", dir=scratch)
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
            raise RuntimeError(f"a worker of level {tasks} did not start: {ready!r} {proc.communicate()[1][-3000:]}")
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
        "user_s": sum(p["user_s"] for p in parts),
        "sys_s": sum(p["sys_s"] for p in parts),
    }


def _peer_command(module: str, tasks: int, sizes: Sizes, base_url: str) -> list[str]:
    from benchmarks.stack import multi_turn_answer

    return [
        python(),
        "-m",
        module,
        "--tasks",
        str(tasks),
        "--turns",
        str(sizes.concurrency_turns),
        "--base-url",
        base_url,
        "--answer",
        multi_turn_answer(sizes.concurrency_turns),
    ]


def run_floor_level(tasks: int, sizes: Sizes, base_url: str) -> dict[str, Any]:
    """The floor (``benchmarks/floor.py``) at one level, in a fresh process unless ``sizes.in_process``."""
    from benchmarks import floor
    from benchmarks.stack import multi_turn_answer

    if sizes.in_process:
        answer = multi_turn_answer(sizes.concurrency_turns)
        return asyncio.run(floor.run_floor(tasks, sizes.concurrency_turns, base_url, answer))
    return _run_json(_peer_command("benchmarks.floor", tasks, sizes, base_url), f"the floor at {tasks} tasks")


def run_inspect_level(tasks: int, sizes: Sizes, base_url: str) -> dict[str, Any]:
    """Inspect AI (``benchmarks/inspect_peer.py``) at one level, always in a fresh process: it sets up logging,
    display and its own event loop for the whole process."""
    return _run_json(_peer_command("benchmarks.inspect_peer", tasks, sizes, base_url), f"Inspect AI at {tasks} tasks")


def _run_json(cmd: list[str], what: str) -> dict[str, Any]:
    out = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=3600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def inspect_missing() -> str | None:
    """Why Inspect AI cannot be run here, or None when it can."""
    version = version_of("inspect-ai")
    if version is None:
        return 'inspect-ai is not installed (`pip install -e ".[bench]"`)'
    return None


def emulator_script(sizes: Sizes) -> dict[str, Any]:
    """flowllm's and the floor's replies (text protocol) by default; Inspect AI's (native tool calls) under its
    own task key, which its requests carry in the ``X-Flowllm-Task`` header."""
    from benchmarks.inspect_peer import TASK_HEADER, native_script
    from benchmarks.stack import multi_turn_script

    script = multi_turn_script(sizes.concurrency_turns, sizes.latency_s)
    return {**script, "tasks": {TASK_HEADER: native_script(sizes.concurrency_turns)}}


COLUMNS = ("flowllm", "workers", "floor", "inspect")


def measure(sizes: Sizes) -> dict[str, Any]:
    """Every level, its repetitions interleaved over the columns (flowllm, flowllm over 2 workers, the floor,
    Inspect AI): a machine that gets busier during the run slows every column alike."""
    results: dict[str, Any] = {"levels": {}, "workers": {}, "floor": {}, "inspect": {}, "inspect_error": None}
    missing = inspect_missing()
    results["inspect_error"] = missing
    # Every run's folder stays until the section ends: on ext4, inodes freed moments before make new ones slower
    # to allocate (the kernel's allocator skips recently deleted inodes), so removing one run's folder would bill
    # the next run for it.
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-conc-") as folder:
        import yaml

        scratch = Path(folder)
        results["file_us"] = [file_creation_us(scratch)]
        script = scratch / "script.yaml"
        script.write_text(yaml.safe_dump(emulator_script(sizes)))
        with EmulatorProcess(script) as emulator:
            url = emulator.base_url
            for tasks in sizes.concurrency:
                for key in ("levels", "workers", "floor", "inspect"):
                    results[key][tasks] = []
                for _ in range(sizes.runs_at(tasks)):
                    results["levels"][tasks].append(run_level(tasks, sizes, url, scratch))
                    results["workers"][tasks].append(run_level_workers(tasks, sizes, url, WORKERS, scratch))
                    results["floor"][tasks].append(run_floor_level(tasks, sizes, url))
                    if results["inspect_error"] is None:
                        try:
                            results["inspect"][tasks].append(run_inspect_level(tasks, sizes, url))
                        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                            results["inspect_error"] = f"Inspect AI failed at {tasks} tasks: {exc}"
        results["file_us"].append(file_creation_us(scratch))
    return results


def _correct(runs: list[dict[str, Any]], tasks: int) -> str:
    """ "all" when every run got every task right (the last cell of every end-to-end table), else what went
    wrong."""
    if all(r["completed"] == r["correct"] == tasks for r in runs):
        return "all"
    worst = min(runs, key=lambda r: r["correct"])
    return f"{worst['correct']}/{tasks} (errors: {worst['errors']})"


def section(results: dict[str, Any], sizes: Sizes) -> Section:
    ideal = sizes.concurrency_turns * sizes.latency_s
    levels = list(results["levels"])
    smallest, top = min(levels), max(levels)
    floor_level = FLOOR_LEVEL if FLOOR_LEVEL in levels else top
    inspect_version = version_of("inspect-ai")
    labels = {
        "flowllm": "flowllm, 1 worker",
        "workers": f"flowllm, {WORKERS} workers",
        "floor": "floor: bare SDK calls",
        "inspect": f"Inspect AI {inspect_version}",
    }
    walls: dict[str, dict[int, Stat]] = {c: {} for c in COLUMNS}
    peaks: dict[str, dict[int, float]] = {c: {} for c in COLUMNS}
    rows = []
    for tasks in levels:
        for column, key in zip(COLUMNS, ("levels", "workers", "floor", "inspect"), strict=True):
            runs = results[key].get(tasks) or []
            if not runs:
                continue
            wall = Stat.of([r["wall_s"] for r in runs])
            peak = Stat.of([r["rss_peak_mb"] for r in runs])
            walls[column][tasks] = wall
            peaks[column][tasks] = peak.median
            rows.append(
                [
                    tasks,
                    labels[column],
                    wall.fmt(2),
                    wall.scaled(1 / ideal).fmt(2, "x"),
                    Stat.of([tasks / r["wall_s"] for r in runs]).fmt(1),
                    f"{Stat.of([r['cpu_s'] / max(r['turns'], 1) * 1000 for r in runs]).median:.2f}",
                    peak.fmt(0),
                    len(runs),
                    _correct(runs, tasks),
                ]
            )
    table = md_table(
        [
            "tasks at once",
            "run",
            "wall s",
            "wall / ideal",
            "tasks/s",
            "CPU ms per turn",
            "peak RSS MB",
            "runs",
            "correct",
        ],
        rows,
    )

    keys = dict(zip(COLUMNS, ("levels", "workers", "floor", "inspect"), strict=True))

    def wall_of(run: dict[str, Any]) -> float:
        return float(run["wall_s"])

    def cpu_per_turn(run: dict[str, Any]) -> float:
        return float(run["cpu_s"]) / max(int(run["turns"]), 1)

    def paired(a: str, b: str, tasks: int, figure: Callable[[dict[str, Any]], float] = wall_of) -> Stat | None:
        """``a``'s figure over ``b``'s repetition by repetition (the i-th runs of the columns ran one after the
        other, interleaved), as median (min-max): a target is met only when the whole range is inside it."""
        pairs = list(zip(results[keys[a]].get(tasks) or [], results[keys[b]].get(tasks) or [], strict=False))
        return Stat.of([figure(x) / figure(y) for x, y in pairs]) if pairs else None

    def ratio(a: str, b: str, tasks: int) -> float | None:
        """The median of ``a``'s wall over ``b``'s at ``tasks``, repetition by repetition (the same ideal, so also
        the ratio of wall / ideal): every table and target of the section states this one figure."""
        found = paired(a, b, tasks)
        return None if found is None else found.median

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    floor_peak = peaks["flowllm"][smallest]
    summary_rows = [
        [
            tasks,
            fmt(ratio("flowllm", "floor", tasks)),
            fmt(ratio("flowllm", "workers", tasks)),
            fmt(ratio("workers", "floor", tasks)),
            fmt(ratio("inspect", "flowllm", tasks)),
            f"{(peaks['flowllm'][tasks] - floor_peak) / (tasks - smallest) * 1024:,.0f}" if tasks > smallest else "-",
        ]
        for tasks in levels
    ]
    summary = md_table(
        [
            "tasks at once",
            "flowllm over the floor (1 worker)",
            f"{WORKERS} workers faster than 1 by",
            f"flowllm over the floor ({WORKERS} workers)",
            "flowllm ahead of Inspect AI by (1 worker)",
            f"flowllm KB per task above {smallest} task{'s' if smallest > 1 else ''}",
        ],
        summary_rows,
    )

    def fmt_range(value: Stat | None) -> str:
        return "-" if value is None else value.fmt(2, "x")

    cpu_turn = {  # CPU ms per model call at the floor's level, each column's median
        c: Stat.of([cpu_per_turn(r) * 1000 for r in results[keys[c]][floor_level]]).median
        for c in COLUMNS
        if results[keys[c]].get(floor_level)
    }
    cpu_over = paired("flowllm", "floor", floor_level, cpu_per_turn)
    over_floor = paired("flowllm", "floor", floor_level, wall_of)
    speedup = paired("flowllm", "workers", top, wall_of)  # 1 worker's wall over 2 workers'
    ahead = {t: ratio("inspect", "flowllm", t) for t in levels}
    measured_ahead = [v for v in ahead.values() if v is not None]
    peak_top = max(peaks["flowllm"][top], peaks["workers"].get(top, 0.0))
    inspect_error = results.get("inspect_error")
    targets = [
        Target(
            f"flowllm's CPU per turn over the floor's per call at {floor_level} tasks (1 worker)",
            f"<= {CPU_TARGET}x",
            fmt_range(cpu_over),
            None if cpu_over is None else cpu_over.max <= CPU_TARGET,
        ),
        Target(
            f"flowllm's wall / ideal over the floor's at {floor_level} tasks",
            f"<= {FLOOR_TARGET}x",
            fmt_range(over_floor),
            None if over_floor is None else over_floor.max <= FLOOR_TARGET,
        ),
        Target(
            f"{WORKERS} workers against 1 at {top} tasks",
            f">= {SPEEDUP_TARGET}x faster",
            fmt_range(speedup),
            None if speedup is None else speedup.min >= SPEEDUP_TARGET,
        ),
        Target(
            "ahead of Inspect AI at every level (its wall over flowllm's)",
            "> 1x at each",
            (f"{min(measured_ahead):.2f}x to {max(measured_ahead):.2f}x" if measured_ahead else "not measured")
            + ("" if len(measured_ahead) == len(levels) else f" ({len(measured_ahead)} of {len(levels)} levels)"),
            None if len(measured_ahead) != len(levels) or inspect_error else all(v > 1 for v in measured_ahead),
        ),
        Target(
            f"peak memory at {top} tasks",
            f"< {MEMORY_TARGET_MB:,.0f} MB",
            f"{peak_top:,.0f} MB",
            peak_top < MEMORY_TARGET_MB,
        ),
    ]
    runs_text = ", ".join(f"{sizes.runs_at(t)} at {t:,}" for t in levels)
    intro = f"""
Tasks of {sizes.concurrency_turns} turns each ({sizes.concurrency_turns - 1} with a calculator call, then the answer),
all started at once, the emulator answering every call {sizes.latency_s * 1000:.0f} ms late (its `delay` fault
at rate 1). Ideal: {sizes.concurrency_turns} x {sizes.latency_s * 1000:.0f} ms = {ideal:.2f} s whatever the number of
tasks. Four runs of the same tasks at each level, each in a fresh process, against the same emulator process:

- **flowllm, 1 worker**: `python -m flowllm`'s stack (Hydra config, `prepare`, the experiment runner,
  `runner=graph_parallel`, `recorder.snapshot=none`, `experiment.max_concurrent` = tasks, tools in process, the
  Anthropic SDK over HTTP).
- **flowllm, {WORKERS} workers**: the same over {WORKERS} processes, as `experiment.workers={WORKERS}` splits a run;
  their peak RSS is the processes' peaks added up.
- **floor: bare SDK calls**: `benchmarks/floor.py`, no flowllm: an asyncio script making the same
  {sizes.concurrency_turns} `messages.create` calls per task with the Anthropic SDK, answering each calculator call
  with a few lines of Python, over the same 16 SDK clients flowllm's provider uses, after one untimed call that
  pays the SDK's one-time set-up. What the SDK itself costs: flowllm's overhead is its distance above this row.
- **Inspect AI**: `benchmarks/inspect_peer.py`, the same tasks as an Inspect AI eval (`generate(tool_calls="loop")`
  with a calculator tool, `includes()` scorer, `max_samples` and `max_connections` = tasks) through its
  OpenAI-compatible provider (`openai-api/...` with the emulator's `/v1` as base URL, the OpenAI SDK, Chat
  Completions); the emulator answers it with native tool calls.

Wall times cover the tasks, not start-up (imports, config, Inspect's task loading and log writing); CPU is the
process's own (all threads) over the same span, per model call; peak RSS is the process's (the emulator runs in
its own). Repetitions, interleaved over the four rows so a busy machine slows them alike: {runs_text}. Cells are
median (min-max).
"""
    runs_top = results["levels"][top]
    cpu_top = Stat.of([r["cpu_s"] for r in runs_top]).median
    wall_top = Stat.of([r["wall_s"] for r in runs_top]).median
    notes = [
        "The targets' ratios are taken repetition by repetition (the i-th run of each column ran beside the i-th "
        "of the others, interleaved), each given as median (min-max): a target is met only when the whole range "
        "is inside it, so one lucky repetition does not meet it.",
        f"At {top:,} tasks the flowllm process is busy for {cpu_top / wall_top:.0%} of the wall time "
        f"({cpu_top:.1f} s of CPU in {wall_top:.1f} s): past a few hundred tasks every column is bound by the CPU "
        "one Python process spends per model call, not by waiting, which is why wall / ideal grows with the "
        "number of tasks for the floor too. "
        + (
            f"At {floor_level} tasks the floor spends {cpu_turn['floor']:.2f} ms of CPU per call (the Anthropic SDK "
            "building the request, httpx2 and httpcore2 sending it, pydantic parsing the reply) and flowllm "
            f"{cpu_turn['flowllm']:.2f} ms per turn: the difference, "
            f"{cpu_turn['flowllm'] - cpu_turn['floor']:.2f} ms, is flowllm's own (the provider layer's limiter, "
            "key pool, breaker and ledger, building the request from the history, parsing and repairing the "
            "reply, the turn graph, the agent loop and the experiment runner)."
            if "floor" in cpu_turn and "flowllm" in cpu_turn
            else ""
        ),
        *cpu_split_notes(results, floor_level, sizes.concurrency_turns),
        f"Two workers split the tasks over {WORKERS} processes; on this machine's 2 cores they share them with the "
        "emulator's process, which serves every call of both.",
        "The emulator is served by `benchmarks/emulator_server.py`: the same application as "
        "`python -m flowllm.emulator`, with a listen backlog of 4,096 instead of 128 and idle connections kept "
        "10 minutes instead of uvicorn's 5 s, as a production endpoint would. With the interactive defaults a "
        "2,000-task run measured the server's queue: connection attempts past the backlog are dropped and retried "
        "a second later, and a pooled connection idle for more than 5 s (a task waiting for the CPU between two "
        "calls) is closed under the client; in one such flowllm run the resulting connection errors opened the "
        "provider's circuit breaker for its 30 s recovery (128 s instead of about 70 s).",
    ]
    if len({sizes.runs_at(t) for t in levels}) > 1:
        notes.append(
            f"Fewer repetitions at the top levels ({runs_text}): one repetition of {top:,} tasks takes minutes "
            "over the four rows, so their min-max spans rest on fewer samples than the lower levels'."
        )
    if inspect_error:
        notes.append(f"Inspect AI: not measured at every level: {inspect_error}")
    return Section(
        "Concurrency: tasks at once against a 100 ms model",
        intro.strip(),
        [table, summary],
        notes,
        targets,
        data={
            "ratio": {k: v.median / ideal for k, v in walls["flowllm"].items()},
            "peak_mb": peaks["flowllm"],
            "workers_speedup": {t: ratio("flowllm", "workers", t) for t in levels},
            "over_floor": {t: ratio("flowllm", "floor", t) for t in levels},
            "inspect_vs_flowllm": ahead,
            "inspect_error": inspect_error,
            "file_creation_us": results.get("file_us"),
        },
    )


def cpu_split_notes(results: dict[str, Any], tasks: int, turns: int) -> list[str]:
    """The CPU per turn at ``tasks`` split into user and system time, and what the run's records cost the kernel:
    the floor writes no file, flowllm a few per task, and what a file costs depends on the disk."""
    per_turn = {}
    for column, key in (("flowllm", "levels"), ("floor", "floor")):
        runs = [r for r in results[key].get(tasks) or [] if "user_s" in r]
        if runs:
            per_turn[column] = [Stat.of([r[k] / max(r["turns"], 1) * 1000 for r in runs]) for k in ("user_s", "sys_s")]
    flowllm_runs = [r for r in results["levels"].get(tasks) or [] if "entries_per_task" in r]
    if "flowllm" not in per_turn or "floor" not in per_turn or not flowllm_runs:
        return []
    (user, system), (floor_user, floor_system) = per_turn["flowllm"], per_turn["floor"]
    entries = Stat.of([r["entries_per_task"] for r in flowllm_runs]).median
    probes = results.get("file_us") or []
    files = (
        f"{min(probes):.0f} to {max(probes):.0f} us of kernel CPU per file on this section's disk (200 files, at "
        f"its start and its end): {entries:.0f} of them over {turns} turns come to "
        f"{entries * min(probes) / turns / 1000:.2f} to {entries * max(probes) / turns / 1000:.2f} ms per turn"
        if probes
        else "not measured on this section's disk"
    )
    return [
        f"CPU per turn at {tasks} tasks, user + system: flowllm {user.fmt(2)} + {system.fmt(2)} ms, the floor "
        f"{floor_user.fmt(2)} + {floor_system.fmt(2)} ms: flowllm's system time is "
        f"{system.median - floor_system.median:.2f} ms per turn above the floor's. The floor writes no file; "
        f"flowllm's run folder gets {entries:.0f} folders and files per task under `recorder.snapshot=none` (the "
        f"task's folder, `timing.json`, `result.json`), each an inode for the kernel to allocate: {files}."
    ]


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
