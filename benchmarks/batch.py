"""Batch mode against direct calls: the bundled sample run by ``python -m flowllm`` both ways on the emulator.

Each variant is a fresh ``python -m flowllm progress=false hydra.run.dir=<temp>`` process: direct calls, then
``provider.batch.enabled=true`` with the given ``max_wait_s`` and ``poll_s`` (the emulator ends a batch on its
first poll). Reported: whether every task gave the same status and answer both ways, the turns and model calls,
the cost of each (summary.json ``cost_usd``, and the ledger's ``providers.cost_usd``), the batches created, and
the wall time, whose difference is the overhead batch mode adds (about ``max_wait_s`` + ``poll_s`` per turn on
the critical path: each turn waits for its batch to fill or time out, then for a poll).

    python -m benchmarks.batch [--protocol anthropic] [--max-wait-s 0.5] [--poll-s 0.2] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flowllm.rundir.results import RunSummary

ROOT = Path(__file__).resolve().parent.parent


def run(run_dir: Path, *overrides: str) -> tuple[float, RunSummary, dict[str, tuple[str, Any]]]:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "flowllm", "progress=false", f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT,
        check=False,
        capture_output=True,
    )
    wall = time.perf_counter() - started
    summary = RunSummary.from_dict(json.loads((run_dir / "summary.json").read_text()))
    answers = {}
    for result in sorted((run_dir / "tasks").glob("*/result.json")):
        data = json.loads(result.read_text())
        answers[data["task_id"]] = (data["status"], data["answer"])
    return wall, summary, answers


def batches(run_dir: Path) -> int:
    journal = run_dir / "batches.jsonl"
    if not journal.is_file():
        return 0
    return sum(1 for line in journal.read_text().splitlines() if '"batch"' in line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batch", description=__doc__)
    parser.add_argument("--max-wait-s", type=float, default=0.5)
    parser.add_argument("--poll-s", type=float, default=0.2)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--protocol", default="anthropic", help="anthropic | openai_chat | openai_responses")
    args = parser.parse_args(argv)
    wire = f"provider.protocol={args.protocol}"
    batched = (
        wire,
        "provider.batch.enabled=true",
        f"provider.batch.max_wait_s={args.max_wait_s}",
        f"provider.batch.poll_s={args.poll_s}",
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-batch-") as scratch:
        for number in range(args.runs):
            d_wall, direct, d_answers = run(Path(scratch) / f"direct-{number}", wire)
            b_wall, batch, b_answers = run(Path(scratch) / f"batch-{number}", *batched)
            rows.append(
                {
                    "same": d_answers == b_answers,
                    "tasks": len(d_answers),
                    "turns": (direct.turns, batch.turns),
                    "calls": (direct.providers["calls"], batch.providers["calls"]),
                    "cost": (direct.cost_usd, batch.cost_usd),
                    "ledger": (direct.providers["cost_usd"], batch.providers["cost_usd"]),
                    "accuracy": (direct.accuracy, batch.accuracy),
                    "batches": batches(Path(scratch) / f"batch-{number}"),
                    "wall": (d_wall, b_wall),
                }
            )
    print(f"{args.protocol}, max_wait_s={args.max_wait_s}, poll_s={args.poll_s}, the sample\n")
    print(
        "| run | tasks | same answers | turns | model calls | batches | cost direct / batch (USD) | ratio | "
        "ledger direct / batch | accuracy | wall direct / batch (s) | overhead (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        (dc, bc), (dl, bl), (dw, bw) = r["cost"], r["ledger"], r["wall"]
        print(
            f"| {i} | {r['tasks']} | {'yes' if r['same'] else 'NO'} | {r['turns'][0]} / {r['turns'][1]} | "
            f"{r['calls'][0]} / {r['calls'][1]} | {r['batches']} | {dc:.6f} / {bc:.6f} | {bc / dc:.3f} | "
            f"{dl:.6f} / {bl:.6f} | {r['accuracy'][0]:.0%} / {r['accuracy'][1]:.0%} | {dw:.1f} / {bw:.1f} | "
            f"{bw - dw:+.1f} |"
        )
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
