"""``python -m flowllm.inspect power``: how many tasks (x epochs) it takes to detect a difference, before
spending anything.

    python -m flowllm.inspect power --baseline 0.6 --delta 0.05 [--epochs 3] [--within-var 0.1]
    python -m flowllm.inspect power --run RUN --delta 0.05 [--epochs 3]

With ``--run`` the baseline accuracy, the within-task variance across epochs (an epochs run) and the cost of
one task-epoch come from the saved run's ``summary.json``; the expected cost of a run of the size needed is
then printed. Figures: flowllm/scoring/stats.py (``plan_power``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from flowllm.engine.recorder import read_json
from flowllm.errors import CliError
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import CostBlock, RunSummary, StatsBlock
from flowllm.scoring.stats import PowerPlan, plan_power

PROG = "python -m flowllm.inspect power"


class PowerUsageError(CliError):
    """Bad arguments or a run without the figures asked for: exit status 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Tasks x epochs needed to detect a difference.")
    parser.add_argument("--baseline", type=float, help="the accuracy now, 0-1 (default with --run: the run's)")
    parser.add_argument("--delta", type=float, required=True, help="the difference to detect, in accuracy (0.05)")
    parser.add_argument("--epochs", type=int, help="epochs per task (default: the run's, else 1)")
    parser.add_argument("--within-var", type=float, help="variance of a task's verdict across epochs (default 0)")
    parser.add_argument("--run", help="a saved run: its accuracy, within-task variance and cost per task-epoch")
    parser.add_argument("--json", action="store_true")
    return parser


def run_figures(path: Path) -> dict[str, Any]:
    """What a saved run says about itself: accuracy over scored tasks, epochs, within-task variance, the cost of
    one task-epoch (None when not known)."""
    layout = RunLayout(path)
    if not layout.summary.is_file():
        raise PowerUsageError(f"{path} has no summary.json (not a finished flowllm run)")
    try:
        summary = read_json(layout.summary)
    except Exception as exc:
        raise PowerUsageError(f"{layout.summary} cannot be read: {exc}") from None
    record = RunSummary.from_dict(summary) if isinstance(summary, dict) else None
    stats = record.stats if record is not None else None
    if record is None or not isinstance(stats, StatsBlock):
        raise PowerUsageError(f"{layout.summary} has no stats (written by an older flowllm); give --baseline")
    acc = stats.accuracy or {}
    epochs = int(stats.epochs or 1)
    finished = int(record.finished or 0)
    cost = record.cost_usd
    replayed = isinstance(record.cost, CostBlock) and bool(record.cost.replayed)
    per_task_epoch = None
    if isinstance(cost, (int, float)) and finished and not replayed:
        per_task_epoch = float(cost) / (finished * epochs)
    return {
        "baseline": acc.get("mean"),
        "epochs": epochs,
        "within_var": acc.get("within_task_var"),
        "cost_per_task_epoch": per_task_epoch,
    }


def plan_from_args(ns: argparse.Namespace) -> tuple[PowerPlan, dict[str, Any] | None]:
    figures = run_figures(Path(ns.run)) if ns.run else None
    baseline = ns.baseline if ns.baseline is not None else (figures or {}).get("baseline")
    if baseline is None:
        raise PowerUsageError("give --baseline (an accuracy between 0 and 1), or --run with a scored run")
    epochs = ns.epochs if ns.epochs is not None else int((figures or {}).get("epochs") or 1)
    within = ns.within_var if ns.within_var is not None else (figures or {}).get("within_var")
    cost = (figures or {}).get("cost_per_task_epoch")
    try:
        plan = plan_power(
            float(baseline), float(ns.delta), epochs=epochs, within_var=float(within or 0.0), cost_per_task_epoch=cost
        )
    except ValueError as exc:
        raise PowerUsageError(str(exc)) from None
    return plan, figures


def render(console: Console, plan: PowerPlan, figures: dict[str, Any] | None, within_given: bool) -> None:
    table = Table(title="power: tasks needed per run", title_justify="left", show_header=False)
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("", overflow="fold")
    table.add_row("to detect", f"{100 * plan.baseline:.1f}% vs {100 * (plan.baseline + plan.delta):.1f}%")
    table.add_row("at", "80% power, two-sided 5% level, two independent runs (a paired run needs fewer)")
    within = f"{plan.within_var:.4f}" if within_given or plan.within_var else "0 (not known: epochs will not help)"
    table.add_row("epochs / within-task variance", f"{plan.epochs} / {within}")
    table.add_row(
        "tasks x epochs", f"{plan.tasks:,} x {plan.epochs} = {plan.tasks * plan.epochs:,} task-epochs per run"
    )
    if figures is not None:
        cost = plan.cost_per_run
        shown = "not known (the run's cost is not known, or it was a replay)" if cost is None else f"${cost:,.2f}"
        table.add_row("expected cost per run", shown)
    console.print(table)


def main(argv: Sequence[str], console: Console) -> int:
    ns = _parser().parse_args(list(argv))
    try:
        plan, figures = plan_from_args(ns)
    except PowerUsageError as exc:
        print(f"flowllm.inspect: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if ns.json:
        sys.stdout.write(json.dumps({**plan.to_dict(), "from_run": ns.run}, indent=2) + "\n")
        return 0
    within_given = ns.within_var is not None or (figures or {}).get("within_var") is not None
    render(console, plan, figures, within_given)
    return 0
