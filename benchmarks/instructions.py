"""Instructions per turn, counted by callgrind: flowllm's live turn, the bare-SDK floor's call, a replayed turn.

Wall and CPU times move with whatever else the machine runs; the number of instructions a process executes does
not. Each figure here is counted by ``valgrind --tool=callgrind`` on two runs of the same workload that differ
in one size only: the difference of their totals over the difference of their turns is what one more turn
costs, start-up (imports, config, opening the provider, the floor's warm-up call) left out. Live, the two runs
differ in turns per task (LIVE_TURNS, the same LIVE_TASKS tasks, so both sides make the same SDK clients in
both runs); replay, in tasks (as the replay benchmark counts it).

* **flowllm, live**: the concurrency benchmark's child (``python -m benchmarks.concurrency --child``: Hydra
  config, ``prepare``, the experiment runner, ``runner=graph_parallel``, recorder off, tools in process, the
  Anthropic SDK over HTTP), every task at once.
* **floor**: ``benchmarks/floor.py``, the same calls made by bare ``messages.create`` calls of the SDK.
* Both against the same emulator process (not counted: it runs outside valgrind), the same script, the same
  turns per task and the same 100 ms model latency.
* **replay**: the replay benchmark's count (``benchmarks.replay.instructions_per_turn``): a saved run re-run with
  ``provider=replay``, recorder off.

Callgrind counts user-space instructions only (no time in the kernel: sockets, file reads) and runs a process's
threads one at a time; it is the stable proxy of CPU per turn, not a replacement for the wall-clock figures.

    python -m benchmarks.instructions [--repeats 3] [--json FIGURES.json] [--before BASELINE.json]

``--json`` saves the figures; ``--before`` reads figures saved from another revision and prints them side by
side with this one's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/instructions.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Section, Sizes, Stat, Target, md_table, python, subprocess_env

LIVE_TASKS = 16  # every live run: as many tasks as the SDK clients both sides spread them over
LIVE_TURNS = (2, 5)  # the two live runs whose counts are subtracted: turns per task
TURNS = 5  # turns per task of the replayed run
LATENCY_S = 0.1
REPLAY_SOURCE_TASKS = 60  # the saved run the replay counts re-run (replay.INSTRUCTION_TASKS subsets of it)
REPLAY_TARGET = 0.75e6  # issue 47: instructions per replayed turn
LIVE_TARGET = 1.25  # issue 47: flowllm's CPU per turn over the floor's per call
_COLLECTED = re.compile(r"Collected\s*:\s*([\d,]+)")
COLUMNS = ("flowllm", "floor", "replay")


@dataclass(frozen=True)
class Counted:
    """One run under callgrind: its instructions and the turns it made."""

    instructions: int
    turns: int


def valgrind_missing() -> str | None:
    return None if shutil.which("valgrind") else "valgrind is not installed"


def _callgrind(cmd: list[str], out_file: Path) -> subprocess.Popen[str]:
    valgrind = shutil.which("valgrind")
    assert valgrind is not None
    env = {**subprocess_env(), "PYTHONHASHSEED": "0"}  # the same dict layouts in every run
    argv = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out_file}", *cmd]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen[str], what: str) -> Counted:
    out, err = proc.communicate(timeout=7200)
    found = _COLLECTED.search(err)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"{what} under callgrind failed:\n{err[-3000:]}")
    figures = json.loads(out.strip().splitlines()[-1])
    if figures["correct"] != figures["tasks"]:
        raise RuntimeError(f"{what}: {figures['correct']} of {figures['tasks']} tasks right ({figures['errors']})")
    return Counted(int(found.group(1).replace(",", "")), int(figures["turns"]))


def per_turn(small: Counted, large: Counted) -> float:
    """What one more turn costs: the difference of two runs' instructions over the difference of their turns."""
    if large.turns <= small.turns:
        raise ValueError(f"the larger run made {large.turns} turns, the smaller {small.turns}")
    return (large.instructions - small.instructions) / (large.turns - small.turns)


def _live_cmd(column: str, turns: int, base_url: str, folder: Path) -> list[str]:
    from benchmarks.stack import multi_turn_answer

    if column == "floor":
        args = ["--tasks", str(LIVE_TASKS), "--turns", str(turns), "--base-url", base_url]
        return [python(), "-m", "benchmarks.floor", *args, "--answer", multi_turn_answer(turns)]
    return [
        *(python(), "-m", "benchmarks.concurrency", "--child", "--tasks", str(LIVE_TASKS), "--turns", str(turns)),
        *("--latency", str(LATENCY_S), "--base-url", base_url, "--folder", str(folder), "--snapshot", "none"),
    ]


def count_live(column: str, base_urls: dict[int, str], folder: Path) -> float:
    """Instructions per turn of ``column`` (flowllm or floor): its two runs at once (two cores; callgrind runs
    one thread at a time)."""
    procs = []
    for turns in LIVE_TURNS:
        sub = folder / f"{column}-{turns}"
        sub.mkdir(parents=True)
        procs.append(_callgrind(_live_cmd(column, turns, base_urls[turns], sub), sub / "callgrind.out"))
    small, large = (_finish(p, f"{column}, {t} turns") for p, t in zip(procs, LIVE_TURNS, strict=True))
    return per_turn(small, large)


def count_replay(folder: Path) -> float:
    from benchmarks import replay

    sizes = dataclasses.replace(Sizes.full(), replay_tasks=REPLAY_SOURCE_TASKS, replay_turns=TURNS)
    source, dataset, _turns = replay.make_source(folder, sizes)
    counted = replay.instructions_per_turn(source, dataset, folder / "counted", TURNS)
    assert counted is not None  # valgrind was found
    return float(counted["per_turn"])


def measure(repeats: int, columns: tuple[str, ...] = COLUMNS) -> dict[str, list[float]]:
    """Every column of ``columns`` ``repeats`` times, interleaved: instructions per turn."""
    import yaml

    from benchmarks.concurrency import EmulatorProcess
    from benchmarks.stack import multi_turn_script

    figures: dict[str, list[float]] = {c: [] for c in COLUMNS}
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-instr-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        urls: dict[int, str] = {}
        for turns in LIVE_TURNS:  # an emulator per length of task: its script says when a task ends
            script = folder / f"script-{turns}.yaml"
            script.write_text(yaml.safe_dump(multi_turn_script(turns, LATENCY_S)), encoding="utf-8")
            urls[turns] = stack.enter_context(EmulatorProcess(script)).base_url
        for i in range(repeats):
            for column in [c for c in ("flowllm", "floor") if c in columns]:
                figures[column].append(count_live(column, urls, folder / f"{i}"))
                print(f"{column} #{i + 1}: {figures[column][-1] / 1e6:.3f}M per turn", file=sys.stderr)
            if "replay" not in columns:
                continue
            figures["replay"].append(count_replay(folder / f"{i}" / "replay"))
            print(f"replay #{i + 1}: {figures['replay'][-1] / 1e6:.3f}M per turn", file=sys.stderr)
    return figures


def _cell(samples: list[float] | None) -> str:
    return "-" if not samples else Stat.of([s / 1e6 for s in samples]).fmt(3, "M")


def section(figures: dict[str, list[float]], before: dict[str, list[float]] | None = None) -> Section:
    """The figures as results.md's section; ``before``: the same figures from another revision, side by side."""
    labels = {
        "flowllm": "flowllm, live (1 worker, recorder off)",
        "floor": "floor: bare SDK calls",
        "replay": "replay, recorder off",
    }
    headers = ["run", "instructions per turn"]
    if before is not None:
        headers = ["run", "before", "after", "after / before"]
    rows = []
    for column in COLUMNS:
        row = [labels[column], _cell(figures[column])]
        if before is not None:
            ratio = Stat.of(figures[column]).median / Stat.of(before[column]).median
            row = [labels[column], _cell(before[column]), _cell(figures[column]), f"{ratio:.2f}x"]
        rows.append(row)
    live = Stat.of(figures["flowllm"]).median
    over = [f / Stat.of(figures["floor"]).median for f in figures["flowllm"]]
    notes = [
        f"flowllm over the floor, instructions per turn: {Stat.of(over).fmt(2, 'x')} "
        f"(each repetition's flowllm count over the floor's median); flowllm's own share is "
        f"{(live - Stat.of(figures['floor']).median) / 1e6:.3f}M instructions per turn."
    ]
    if before is not None:
        over_before = Stat.of(before["flowllm"]).median / Stat.of(before["floor"]).median
        notes.append(f"Before: flowllm over the floor {over_before:.2f}x.")
    replay = Stat.of(figures["replay"])
    targets = [
        Target(
            "instructions per replayed turn (the issue's stable proxy for replay)",
            f"<= {REPLAY_TARGET / 1e6:.2f}M",
            f"{replay.median / 1e6:.3f}M ({replay.min / 1e6:.3f}-{replay.max / 1e6:.3f})",
            replay.max <= REPLAY_TARGET,
        ),
        Target(
            "flowllm's instructions per live turn over the floor's per call",
            f"<= {LIVE_TARGET}x",
            f"{Stat.of(over).median:.2f}x ({min(over):.2f}-{max(over):.2f})",
            max(over) <= LIVE_TARGET,
        ),
    ]
    intro = (
        f"`python -m benchmarks.instructions`: instructions per turn counted by callgrind (`valgrind "
        f"--tool=callgrind`). Live: {LIVE_TASKS} tasks at once ({LATENCY_S * 1000:.0f} ms model latency), the "
        f"difference between runs of {LIVE_TURNS[0]} and {LIVE_TURNS[1]} turns per task, so start-up and the "
        "per-task costs (workspace, scoring) are left out and the count is that of the later turns, longer "
        "conversations than the average; flowllm and the floor against the same emulator processes, over the "
        "same number of SDK clients. Replay as in the replay section (tasks subtracted, per-task costs "
        "included). A count mostly repeats within about 1% whatever else the machine runs, so it is how a change "
        "to the hot path is judged on a shared machine; now and then one count lands 7-15% off, which the "
        "median of the repetitions leaves out. "
        f"Median (min-max) of {len(figures['flowllm'])} repetitions. It counts user-space instructions only: no "
        "time in the kernel (sockets, files), and it weighs an instruction the same whether it hits the cache "
        "or not; the wall-clock figures of the concurrency and replay sections remain the targets' own measure."
    )
    data = {"figures": figures, "before": before}
    return Section("Instructions per turn", intro, [md_table(headers, rows)], notes, targets, data)


def run(sizes: Sizes) -> Section:
    missing = valgrind_missing()
    if sizes.in_process or missing:  # a smoke run: counting takes minutes under valgrind
        why = missing or "not counted in a --quick run (callgrind takes minutes)"
        return Section("Instructions per turn", f"Instructions per turn: {why}.")
    return section(measure(3))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="repetitions of every column (default 3)")
    parser.add_argument("--only", nargs="+", choices=COLUMNS, default=list(COLUMNS), help="count these only")
    parser.add_argument("--json", type=Path, help="save the figures here")
    parser.add_argument("--before", type=Path, help="figures saved by --json from another revision")
    args = parser.parse_args(argv)
    missing = valgrind_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 1
    figures = measure(args.repeats, tuple(args.only))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1), encoding="utf-8")
    if set(args.only) != set(COLUMNS):
        print(json.dumps(figures))
        return 0
    before = json.loads(args.before.read_text(encoding="utf-8")) if args.before else None
    print(section(figures, before).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
