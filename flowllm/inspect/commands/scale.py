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

from flowllm.analysis.epoch_runs import RunEpochs, expand_runs
from flowllm.analysis.rerank import judge_provider
from flowllm.analysis.scale_plot import plot_scale
from flowllm.analysis.scale_report import ScaleReport, point_text, scale_report
from flowllm.analysis.scaling import Bootstrap, Metric
from flowllm.bundle.unpack import unpacked_runs
from flowllm.core.scratch import scratch as scratch_folder
from flowllm.inspect.commands.common import PROG, UsageError
from flowllm.inspect.commands.render import emit_json, esc
from flowllm.run.report import format_usd

__all__ = ["main"]


def _cost(value: float | None) -> str:
    return "not known" if value is None else format_usd(value)


def _run_table(report: ScaleReport, index: int) -> Table:
    curves = report.runs[index]
    table = Table(title=f"{curves.run.label} ({curves.run.epochs} epochs)", title_justify="left", box=box.SIMPLE_HEAD)
    metrics = list(curves.curves)
    for name in ("k", *(m.value for m in metrics), "tasks", "cost / task"):
        table.add_column(name, justify="right")
    best = curves.curves.get(Metric.best)
    for k in curves.curves[Metric.majority]:
        first = curves.curves[Metric.majority][k]
        cost = _cost(first.cost_per_task_usd)
        if best is not None and k in best:
            cost += f" (best-of-k {_cost(best[k].cost_per_task_usd)})"
        cells = (point_text(curves.curves[m][k]) if k in curves.curves[m] else "-" for m in metrics)
        table.add_row(str(k), *cells, str(first.n), cost)
    return table


def render(console: Console, report: ScaleReport) -> None:
    boot = report.bootstrap
    console.print(
        f"[bold]{len(report.tasks)} tasks[/bold]; intervals: {100 * boot.confidence:.0f}% percentile bootstrap over "
        f"tasks ({boot.resamples} resamples, seed {boot.seed}); cost per task: what the agent's calls were billed "
        "(usage.jsonl), not the grading judge's"
    )
    for curves in report.runs:  # no epoch of theirs has a verdict: no ground truth, a judge that failed...
        if curves.run.unscored:
            shown = ", ".join(curves.run.unscored)
            console.print(f"[yellow]left out (no scored epoch), {esc(curves.run.label)}:[/yellow] {esc(shown)}")
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
        calls = [v for label, v in report.best_of_k.items() if label != "judge"]
        console.print(
            f"best-of-k: judge {esc(report.best_of_k['judge'])} picked among the first k epochs' answers; "
            f"{sum(c['calls'] for c in calls)} calls made now, {sum(c['replayed'] for c in calls)} read back "
            "from the runs' recorded judge calls"
        )
    if report.frontier:
        console.print("Pareto frontier (accuracy against cost per task): " + ", ".join(esc(f) for f in report.frontier))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{PROG} scale", description="Test-time scaling from saved epochs.")
    parser.add_argument("runs", nargs="+", help="run folders or bundles (flowllm bundle); a sweep stands for its jobs")
    parser.add_argument("--k", type=int, default=None, help="the largest k (default: the epochs run)")
    parser.add_argument("--agreement", type=float, default=0.8, help="cascade: escalate below this agreement")
    parser.add_argument("--resamples", type=int, default=Bootstrap.resamples, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=Bootstrap.seed, help="bootstrap seed")
    parser.add_argument("--judge", default=None, help="best-of-k: a conf/provider name[:model] picks the answer")
    parser.add_argument("--judge-script", default=None, help="the judge's emulator script (offline judges)")
    parser.add_argument("--plot", type=Path, default=None, help="write accuracy against cost per task (PNG)")
    parser.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str], console: Console) -> int:
    ns = _parser().parse_args(list(argv))
    if ns.k is not None and ns.k < 1:
        raise UsageError(f"--k must be at least 1 (got {ns.k})")
    if not 0 < ns.agreement <= 1:
        raise UsageError(f"--agreement is a share of epochs in (0, 1] (got {ns.agreement})")
    with scratch_folder("flowllm-scale-") as scratch:
        opened = iter(range(len(ns.runs)))
        runs = expand_runs(ns.runs, lambda bundle: unpacked_runs(bundle, scratch / str(next(opened))))
        return _scale(ns, runs, console)


def _scale(ns: argparse.Namespace, runs: list[RunEpochs], console: Console) -> int:
    judge = None if ns.judge is None else (ns.judge, judge_provider(ns.judge, ns.judge_script))
    report = scale_report(runs, k=ns.k, agreement=ns.agreement, bootstrap=Bootstrap(ns.resamples, ns.seed), judge=judge)
    plotted = plot_scale(report, ns.plot) if ns.plot is not None else None
    if ns.json:
        emit_json({**report.to_dict(), "plot": None if plotted is None else str(plotted)})
        return 0
    render(console, report)
    if ns.plot is not None:
        console.print(f"plot: {esc(plotted)}" if plotted else "[yellow]no plot: matplotlib is not installed[/yellow]")
    return 0
