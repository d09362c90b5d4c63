"""``inspect scale``'s figures for one or more runs: the common tasks, each run's curves, the cascade and the
Pareto frontier of accuracy against cost per task (flowllm/analysis/scaling.py computes each figure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowllm.analysis.epoch_runs import RunEpochs, read_epochs
from flowllm.analysis.rerank import best_of_k
from flowllm.analysis.scaling import EPOCH_METRICS, Bootstrap, Cascade, Metric, Point, RunCurves, cascade, run_curves
from flowllm.config.provider_schema import ProviderConfig
from flowllm.errors import CliError
from flowllm.sweep.stats import pareto_front

__all__ = [
    "KTooLarge",
    "NoCommonTask",
    "ScaleReport",
    "frontier",
    "labelled_points",
    "point_text",
    "scale_report",
    "scale_rows",
]


class NoCommonTask(CliError):
    """The runs have no scored task in common: exit status 2."""


class KTooLarge(CliError):
    """``--k`` is more than the epochs run: exit status 2, naming the largest k."""


@dataclass
class ScaleReport:
    bootstrap: Bootstrap
    tasks: list[str]
    left_out: dict[str, list[str]]
    runs: list[RunCurves]
    cascade: Cascade | None = None
    best_of_k: dict[str, Any] | None = None
    frontier: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval": self.bootstrap.describe(),
            "tasks": len(self.tasks),
            "task_ids": self.tasks,
            "left_out": self.left_out,
            "unscored": {r.run.label: r.run.unscored for r in self.runs if r.run.unscored},
            "runs": [r.to_dict() for r in self.runs],
            "cascade": None if self.cascade is None else self.cascade.to_dict(),
            "best_of_k": self.best_of_k,
            "frontier": self.frontier,
        }


def _common(runs: Sequence[RunEpochs]) -> tuple[list[str], dict[str, list[str]]]:
    common = set(runs[0].tasks)
    for run in runs[1:]:
        common &= set(run.tasks)
    if not common:
        sizes = ", ".join(f"{len(r.tasks)} in {r.label}" for r in runs)
        raise NoCommonTask(f"the runs have no scored task in common ({sizes})")
    left = {r.label: sorted(set(r.tasks) - common) for r in runs}
    return sorted(common), {label: ids for label, ids in left.items() if ids}


def labelled_points(report: ScaleReport) -> list[tuple[str, Point]]:
    """Every figure with its label (``run majority@3``, ``cascade``), in the order shown."""
    points = [
        (f"{r.run.label} {m.value[:-1]}{k}", p)
        for r in report.runs
        for m, by_k in r.curves.items()
        for k, p in by_k.items()
    ]
    if report.cascade is not None:
        points.append(("cascade", report.cascade.point))
    return points


def scale_rows(run_dir: Path) -> dict[str, Any] | None:
    """The HTML report's scaling card of a run with epochs (None without): one row of text per k."""
    run = read_epochs(run_dir)
    if run.epochs <= 1 or not run.tasks:
        return None
    report = scale_report([run], k=None, agreement=1.0)
    curves = report.runs[0].curves
    rows = []
    for k in curves[Metric.majority]:
        cost = curves[Metric.majority][k].cost_per_task_usd
        shown = "not known" if cost is None else f"${cost:.4f}"
        rows.append([str(k), *(point_text(curves[m][k]) for m in EPOCH_METRICS), shown])
    boot = report.bootstrap
    note = (
        f"{len(report.tasks)} tasks; {100 * boot.confidence:.0f}% percentile bootstrap over tasks "
        f"({boot.resamples} resamples, seed {boot.seed}); flowllm inspect scale RUN for the frontier and a plot"
    )
    return {"columns": ["k", *(m.value for m in EPOCH_METRICS), "cost / task"], "rows": rows, "note": note}


def point_text(point: Point) -> str:
    """``62.0% [50.1, 73.0]`` (the interval left out when not known)."""
    if point.value is None:
        return "-"
    ci = f" [{100 * point.ci[0]:.1f}, {100 * point.ci[1]:.1f}]" if point.ci else ""
    return f"{100 * point.value:.1f}%{ci}"


def frontier(report: ScaleReport) -> list[str]:
    """The Pareto frontier of what a system can deploy: majority@k, mean@k, best-of-k and the cascade (pass@k
    needs an oracle to pick the correct epoch, pass^k is a reliability figure); one label per distinct point."""
    seen: dict[tuple[float, float], str] = {}
    for label, p in labelled_points(report):
        if p.value is None or p.cost_per_task_usd is None or " pass" in label:
            continue
        seen.setdefault((float(p.cost_per_task_usd), float(p.value)), label)
    points = list(seen)
    return [seen[points[i]] for i in pareto_front(points)]


def scale_report(
    runs: Sequence[RunEpochs],
    *,
    k: int | None,
    agreement: float,
    bootstrap: Bootstrap | None = None,
    judge: tuple[str, ProviderConfig] | None = None,
) -> ScaleReport:
    """The figures of ``runs`` over their common tasks; raises ``NoCommonTask`` and ``KTooLarge``."""
    bootstrap = bootstrap or Bootstrap()
    tasks, left_out = _common(runs)
    largest = min(r.epochs for r in runs)
    if k is not None and k > largest:
        raise KTooLarge(f"k={k} is more than the epochs run: the largest k is {largest}")
    max_k = k or largest
    curves = [run_curves(r, tasks, min(max_k, r.epochs), bootstrap) for r in runs]
    report = ScaleReport(bootstrap, tasks, left_out, curves)
    if judge is not None:
        report.best_of_k = {"judge": judge[0]}
        for run in curves:
            ranked = best_of_k(run.run, tasks, min(max_k, run.run.epochs), judge[1], bootstrap)
            run.curves[Metric.best] = ranked.pop("curve")
            report.best_of_k[run.run.label] = ranked
    if len(runs) > 1:
        report.cascade = cascade(runs, tasks, agreement, bootstrap)
    report.frontier = frontier(report)
    return report
