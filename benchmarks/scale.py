"""``inspect scale`` and ``inspect bisect``'s planning on synthetic run folders.

* scale: two runs of 1,000 tasks x 5 epochs (each task's epochs answer from a pool of three answers, one right;
  five ledger lines per task), read and computed by ``python -m flowllm.inspect scale A B --json`` in process:
  every metric for k = 1..5 with 2,000 bootstrap resamples each, the cascade and the frontier.
* bisect: two runs of 200 tasks whose fingerprints differ in repair and in max_turns, planned by ``inspect
  bisect A B --dry-run --json``: the fingerprints and configs read, the changed settings, the differing tasks and
  the seeded sample, the projection from A's ledger. The forks themselves are live runs of the changed part:
  what they cost against a full re-run is the fork benchmark's figure (``benchmarks/fork.py``).

    python -m benchmarks.scale [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.common import Section, Sizes, Stat, md_table
from flowllm.inspect.cli import main as inspect_main
from flowllm.rundir.results import LedgerLine, TaskResult

EPOCHS = 5


def write_run(root: Path, tasks: int, epochs: int, seed: int, settings: dict[str, object]) -> Path:
    """A run folder: each task's result.json with its epochs, a ledger line per epoch, a fingerprint and config."""
    rng = random.Random(seed)
    lines = []
    for i in range(tasks):
        task_id = f"task-{i:05d}"
        folder = root / "tasks" / task_id
        folder.mkdir(parents=True)
        skill = rng.random()
        log = []
        for epoch in range(1, epochs + 1):
            right = rng.random() < skill
            answer = "42" if right else rng.choice(["41", "43"])
            log.append({"epoch": epoch, "status": "completed", "answer": answer, "correct": right})
            cost = round(0.001 + 0.002 * rng.random(), 6)
            lines.append(LedgerLine(type="attempt", task_id=task_id, epoch=epoch, outcome="ok", cost_usd=cost))
        correct = sum(e["correct"] for e in log) / epochs >= 0.5
        result = TaskResult(task_id=task_id, status="completed", answer="42", correct=correct)
        data = {**result.to_dict(), "epochs": epochs, "epoch_log": log, "score": float(correct)}
        (folder / "result.json").write_text(json.dumps(data))
    (root / "usage.jsonl").write_text("".join(json.dumps(line.to_dict()) + "\n" for line in lines))
    (root / "fingerprint.json").write_text(json.dumps({"settings": settings, "dataset_files": {"a.jsonl": "0"}}))
    choices = {"repair": settings["repair.name"], "provider": "offline"}
    (root / ".hydra").mkdir()
    (root / ".hydra" / "hydra.yaml").write_text(json.dumps({"hydra": {"runtime": {"choices": choices}}}))
    (root / ".hydra" / "config.yaml").write_text(json.dumps({"agent": {"max_turns": settings["agent.max_turns"]}}))
    return root


def _timed(argv: list[str], runs: int) -> tuple[Stat, dict[str, object]]:
    samples, data = [], {}
    for _ in range(runs):
        out = io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(out):
            assert inspect_main(argv) == 0
        samples.append(time.perf_counter() - started)
        data = json.loads(out.getvalue())
    return Stat.of(samples), data


def run(sizes: Sizes) -> Section:
    quick = sizes.runs <= 1
    scale_tasks, bisect_tasks = (20, 10) if quick else (1000, 200)
    runs = max(1, min(sizes.runs, 3))
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-scale-") as tmp:
        root = Path(tmp)
        a_settings = {"repair.name": "full", "agent.max_turns": 8}
        b_settings = {"repair.name": "strict", "agent.max_turns": 4}
        a = write_run(root / "a", scale_tasks, EPOCHS, 1, a_settings)
        b = write_run(root / "b", scale_tasks, EPOCHS, 2, b_settings)
        scale_stat, scale = _timed(["scale", str(a), str(b), "--json"], runs)
        ba = write_run(root / "ba", bisect_tasks, 1, 3, a_settings)
        bb = write_run(root / "bb", bisect_tasks, 1, 4, b_settings)
        bisect_stat, plan = _timed(["bisect", str(ba), str(bb), "--dry-run", "--json"], runs)
    figures = len(scale["runs"]) * 4 * EPOCHS  # type: ignore[arg-type]
    rows = [
        [
            f"scale: 2 runs x {scale_tasks} tasks x {EPOCHS} epochs ({figures} figures, 2,000 resamples each, cascade)",
            f"{scale_stat.median:.2f} ({scale_stat.min:.2f}-{scale_stat.max:.2f})",
            f"{1000 * scale_stat.median / (2 * scale_tasks):.2f}",
        ],
        [
            f"bisect --dry-run: 2 runs x {bisect_tasks} tasks, "
            f"{len(plan['differing_tasks'])} differing + {len(plan['sampled_tasks'])} sampled",  # type: ignore[arg-type]
            f"{bisect_stat.median:.2f} ({bisect_stat.min:.2f}-{bisect_stat.max:.2f})",
            f"{1000 * bisect_stat.median / (2 * bisect_tasks):.2f}",
        ],
    ]
    intro = (__doc__ or "").split("\n\n")[
        1
    ] + f"\n\nMedian of {runs} runs, in process (the interpreter's start-up aside)."
    table = md_table(["what", "wall s, median (min-max)", "ms per task and run"], rows)
    return Section("Scaling figures and bisect planning", intro, [table], data={"scale_s": scale_stat.median})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(run(Sizes.quick() if args.quick else Sizes.full()).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
