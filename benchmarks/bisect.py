"""``inspect bisect`` over 200 tasks, forks and all: two saved runs that differ in two settings, attributed.

The workload (the emulator's script): every task computes with the calculator, then answers. Every fourth task
writes its turn-2 call in single-quoted JSON, which only the lenient repair stages read; every fifth task needs
one turn more than the others. Run A has ``repair=full`` and room for every task's turns; run B has
``repair=strict`` and ``agent.max_turns`` one below what the long tasks need. So by construction strict repair
breaks the short tasks among every fourth (20%: a long one recovers, its next call gives the answer) and
max_turns the long ones (20%); the two sets are disjoint, so the observed difference is -40 points, each effect
-20 and the interaction 0.

``python -m flowllm.inspect bisect A B`` then forks A once per setting (two real ``python -m flowllm`` runs,
each with its emulator) on the tasks whose result differs and a seeded sample of the others, live from each
task's first differing request. The benchmark reports the wall time of the bisect (the forks included), the
live calls (as the summaries count them, checked against the requests the emulators logged), what they cost
against A's full run, and the attribution.

    python -m benchmarks.bisect [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import Section, Sizes, md_table, python, subprocess_env
from benchmarks.fork import lenient_call
from benchmarks.stack import MATH, tool_call_text
from flowllm.emulator.server import CAPTURE_ENV
from flowllm.inspect.cli import main as inspect_main
from flowllm.rundir.results import RunSummary

TURNS = 3  # a task's turns (two calls, then the answer); a long task takes one more
LENIENT_EVERY, LONG_EVERY = 4, 5
MAX_CONCURRENT = 16


def _task(i: int) -> tuple[str, list[dict[str, str]], str]:
    """A task's id, its scripted replies and its answer."""
    calls = TURNS - 1 + (i % LONG_EVERY == 0)
    replies = [
        {
            "text": f"Step {t}: let me compute.\n\n"
            + (
                lenient_call(t)
                if i % LENIENT_EVERY == 0 and t == 2
                else tool_call_text(*MATH, {"expression": f"2**{t} + {t}"})
            )
        }
        for t in range(1, calls + 1)
    ]
    replies.append({"text": "The result is ${last_tool_result}.\n\n\\boxed{${last_tool_result}}"})
    return f"t{i:05d}", replies, str(2**calls + calls)


def write_workload(folder: Path, tasks: int) -> Path:
    """The dataset, and the script where the offline provider looks first (``data/sample/script.yaml`` under the
    working directory): A, B and the forks' live provider all answer from it."""
    made = [_task(i) for i in range(tasks)]
    dataset = folder / "dataset"
    dataset.mkdir(parents=True)
    rows = [{"task_id": t, "Question": "Compute the value.", "Level": 1, "Final answer": a} for t, _, a in made]
    (dataset / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    script = folder / "data" / "sample" / "script.yaml"
    script.parent.mkdir(parents=True)
    body = {"default": [{"text": "\\boxed{none}"}], "tasks": {t: replies for t, replies, _ in made}}
    script.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return dataset


def run_saved(folder: Path, name: str, dataset: Path, settings: list[str]) -> Path:
    out = folder / name
    command = [python(), "-m", "flowllm", f"dataset.path={dataset}", "runner=graph_parallel"]
    command += [f"experiment.max_concurrent={MAX_CONCURRENT}", "progress=false", *settings, f"hydra.run.dir={out}"]
    done = subprocess.run(command, cwd=folder, env=subprocess_env(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"run {name} failed: {done.stderr.strip().splitlines()[-1:]}")
    return out


def measure(tasks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-bisect-") as tmp:
        folder = Path(tmp)
        dataset = write_workload(folder, tasks)
        a = run_saved(folder, "a", dataset, ["repair=full", f"agent.max_turns={TURNS + 1}"])
        b = run_saved(folder, "b", dataset, ["repair=strict", f"agent.max_turns={TURNS - 1}"])
        capture = folder / "requests.jsonl"
        out = io.StringIO()
        with contextlib.chdir(folder), contextlib.redirect_stdout(out):
            os.environ[CAPTURE_ENV] = str(capture)
            try:
                started = time.perf_counter()
                code = inspect_main(["bisect", str(a), str(b), "--out", str(folder / "forks"), "--json"])
                wall = time.perf_counter() - started
            finally:
                os.environ.pop(CAPTURE_ENV, None)
        assert code == 0, "the bisect failed"
        data = json.loads(out.getvalue())
        logged = sum(1 for _ in capture.open(encoding="utf-8")) if capture.exists() else 0
        saved_calls = sum(1 for line in (a / "usage.jsonl").open(encoding="utf-8") if '"attempt"' in line)
        summary = RunSummary.from_dict(json.loads((a / "summary.json").read_text(encoding="utf-8")))
    return {
        "tasks": tasks,
        "wall_s": wall,
        "bisect": data,
        "emulator_requests": logged,
        "a_calls": saved_calls,
        "a_cost_usd": summary.cost.total_usd if summary.cost is not None else None,
    }


def section(results: dict[str, Any]) -> Section:
    data = results["bisect"]
    spent = data["spent"]
    forked = len(data["differing_tasks"]) + len(data["sampled_tasks"])
    rows = [
        [
            e["setting"],
            " ".join(e["overrides"]),
            f"{100 * e['effect']:+.1f}",
            f"[{100 * e['ci'][0]:+.1f}, {100 * e['ci'][1]:+.1f}]" if e["ci"] else "not known",
            f"{e['fixed']} / {e['broken']}",
        ]
        for e in data["effects"]
    ]
    rows.append(["interaction", "", f"{100 * data['interaction']:+.1f}", "", ""])
    rows.append(["observed B - A", "", f"{100 * data['observed']:+.1f}", "", ""])
    table = md_table(["setting", "fork override", "effect (points)", "interval", "fixed / broken"], rows)
    cost = spent.get("live_cost_usd")
    a_cost = results["a_cost_usd"]
    figures = md_table(
        ["what", "figure"],
        [
            ["wall time of the bisect (both forks, in parallel)", f"{results['wall_s']:.1f} s"],
            ["tasks forked per setting", f"{forked} of {results['tasks']} ({len(data['differing_tasks'])} differing)"],
            ["live calls (summaries; emulators logged)", f"{spent['live_calls']:,}; {results['emulator_requests']:,}"],
            ["model calls of run A (its ledger)", f"{results['a_calls']:,}"],
            ["cost of the forks (projected)", f"${cost or 0:.4f} (${data['projected_cost_usd'] or 0:.4f})"],
            ["cost of run A", "not known" if a_cost is None else f"${a_cost:.4f}"],
        ],
    )
    intro = (__doc__ or "").split("\n\n")[
        1
    ] + f"\n\n{results['tasks']} tasks, {MAX_CONCURRENT} at once, emulator prices."
    return Section("Bisect over saved runs", intro, [figures, table], data={"bisect_wall_s": results["wall_s"]})


def run(sizes: Sizes) -> Section:
    return section(measure(20 if sizes.runs <= 1 else 200))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bisect", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 tasks (a smoke run, not a measurement)")
    parser.add_argument("--json", action="store_true", help="print the raw figures instead of the section")
    args = parser.parse_args(argv)
    results = measure(20 if args.quick else 200)
    print(json.dumps(results, indent=1) if args.json else section(results).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
