"""``flowllm merge SHARD... -o RUN``: the folders of ``experiment.shard=I/N`` runs merged into one run folder
(flowllm/experiment/merge.py). Exit status: 0 merged, 2 the folders are not the shards of one run (nothing is
written but what a refused merge had copied into the new folder)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from flowllm.errors import FlowError
from flowllm.exit_codes import ExitCode
from flowllm.run.report import format_usd, headline_accuracy
from flowllm.rundir.store import local_run

__all__ = ["main"]

PROG = "flowllm merge"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Merge the run folders of experiment.shard=I/N runs into one run: task folders and ledgers "
        "put together, the summary computed once. The shards must have run with the same settings.",
    )
    parser.add_argument("shards", nargs="+", help="the shards' run folders, or their stores' URLs")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the merged run's folder (new or empty)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from flowllm.experiment.merge import merge_shards

    try:
        merged = merge_shards([local_run(shard) for shard in args.shards], args.output)
    except FlowError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", ExitCode.CONFIG))
    summary = merged.summary
    if merged.missing_shards:
        missing = ", ".join(map(str, merged.missing_shards))
        print(f"{PROG}: warning: shards {missing} were not given: their tasks are unfinished", file=sys.stderr)
    # Said as the run's own console says it: over the scored tasks, what was left unscored, a cost not known.
    cost = "cost not known (a model has no price)" if summary.cost_usd is None else format_usd(summary.cost_usd)
    ended = f"; the budget ended it: {summary.budget.reason}" if summary.budget_ended_run and summary.budget else ""
    print(
        f"{PROG}: {merged.run_dir}: {summary.tasks} tasks, {summary.completed} completed, {summary.failed} failed, "
        f"accuracy {headline_accuracy(summary)}, {cost}{ended}"
    )
    return int(ExitCode.OK)
