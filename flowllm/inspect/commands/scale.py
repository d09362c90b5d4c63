"""``python -m flowllm.inspect scale RUN [RUN...] [--k K] [--agreement A] [--plot FILE] [--json]``: test-time
scaling from saved epochs, with no model call (flowllm/analysis/scaling.py): majority@k, pass@k, pass^k and
mean@k for k = 1..K with their bootstrap intervals and cost per task, the cascade over several runs, the Pareto
frontier of accuracy against cost per task and its plot. A sweep folder stands for its jobs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from flowllm.analysis.epoch_runs import expand_runs
from flowllm.analysis.scale_plot import plot_scale
from flowllm.analysis.scale_report import ScaleReport, point_text, scale_report
from flowllm.analysis.scaling import Bootstrap, Metric
from flowllm.inspect.commands.common import PROG, UsageError
from flowllm.inspect.commands.render import emit_json, esc
from flowllm.run.report import format_usd

__all__ = ["main"]


def _cost(value: float | None) -> str:
    return "not known" if value is None else format_usd(value)


def _run_table(report: ScaleReport, index: int) -> Table:
    curves = report.runs[index]
    table = Table(title=f"{curves.run.label} ({curves.run.epochs} epochs)", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("k", *(m.value for m in Metric), "tasks", "cost / task"):
        table.add_column(name, justify="right")
    for k in curves.curves[Metric.majority]:
        first = curves.curves[Metric.majority][k]
        table.add_row(
            str(k),
            *(point_text(curves.curves[m][k]) for m in Metric),
            str(first.n),
            _cost(first.cost_per_task_usd),
        )
    return table


def render(console: Console, report: ScaleReport) -> None:
    boot = report.bootstrap
    console.print(
        f"[bold]{len(report.tasks)} tasks[/bold]; intervals: {100 * boot.confidence:.0f}% percentile bootstrap over "
        f"tasks ({boot.resamples} resamples, seed {boot.seed}); cost per task from the usage ledgers"
    )
    for label, ids in report.left_out.items():
        console.print(f"[yellow]left out (not scored in every run), {esc(label)}:[/yellow] {esc(', '.join(ids))}")
    for i in range(len(report.runs)):
        console.print(_run_table(report, i))
    if report.cascade is not None:
        c = report.cascade
        by = ", ".join(f"{esc(label)} {n}" for label, n in c.answered_by.items())
        console.print(
            f"cascade ({' -> '.join(esc(o) for o in c.order)}, escalate below {100 * c.threshold:.0f}% agreement): "
            f"{point_text(c.point)}, {_cost(c.point.cost_per_task_usd)} per task; answered by {by}"
        )
    if report.best_of_k:
        console.print(
            f"best-of-k (judge {esc(report.best_of_k['judge'])}): "
            + ", ".join(
                f"k={k} {100 * v['value']:.1f}%" for k, v in report.best_of_k["curve"].items() if v["value"] is not None
            )
        )
    if report.frontier:
        console.print("Pareto frontier (accuracy against cost per task): " + ", ".join(esc(f) for f in report.frontier))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{PROG} scale", description="Test-time scaling from saved epochs.")
    parser.add_argument("runs", nargs="+", help="run folders (a sweep folder stands for its jobs)")
    parser.add_argument("--k", type=int, default=None, help="the largest k (default: the epochs run)")
    parser.add_argument("--agreement", type=float, default=0.8, help="cascade: escalate below this agreement")
    parser.add_argument("--resamples", type=int, default=Bootstrap.resamples, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=Bootstrap.seed, help="bootstrap seed")
    parser.add_argument("--plot", type=Path, default=None, help="write accuracy against cost per task (PNG)")
    parser.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str], console: Console) -> int:
    ns = _parser().parse_args(list(argv))
    if ns.k is not None and ns.k < 1:
        raise UsageError(f"--k must be at least 1 (got {ns.k})")
    if not 0 < ns.agreement <= 1:
        raise UsageError(f"--agreement is a share of epochs in (0, 1] (got {ns.agreement})")
    runs = expand_runs(ns.runs)
    report = scale_report(runs, k=ns.k, agreement=ns.agreement, bootstrap=Bootstrap(ns.resamples, ns.seed))
    plotted = plot_scale(report, ns.plot) if ns.plot is not None else None
    if ns.json:
        emit_json({**report.to_dict(), "plot": None if plotted is None else str(plotted)})
        return 0
    render(console, report)
    if ns.plot is not None:
        console.print(f"plot: {esc(plotted)}" if plotted else "[yellow]no plot: matplotlib is not installed[/yellow]")
    return 0
