"""``inspect scale --plot FILE``: accuracy against cost per task, the sweep plot's style (flowllm/sweep/summary.py):
one line per run and metric over k, each point's interval as an error bar, the Pareto frontier as a step line."""

from __future__ import annotations

from pathlib import Path

from flowllm.analysis.scale_report import ScaleReport, labelled_points

__all__ = ["plot_scale"]

_COLORS = {
    "majority@k": "#1f77b4",
    "pass@k": "#2ca02c",
    "pass^k": "#d62728",
    "mean@k": "#7f7f7f",
    "best-of-k": "#9467bd",
}


def plot_scale(report: ScaleReport, path: Path) -> Path | None:
    """The PNG at ``path``; None without matplotlib or without a priced figure."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    points = {label: p for label, p in labelled_points(report)}
    if not any(p.value is not None and p.cost_per_task_usd is not None for p in points.values()):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    try:
        for run in report.runs:
            for metric, by_k in run.curves.items():
                shown = [p for p in by_k.values() if p.value is not None and p.cost_per_task_usd is not None]
                xs = [float(p.cost_per_task_usd or 0.0) for p in shown]
                ys = [100 * float(p.value or 0.0) for p in shown]
                low = [y - 100 * p.ci[0] if p.ci else 0.0 for y, p in zip(ys, shown, strict=True)]
                high = [100 * p.ci[1] - y if p.ci else 0.0 for y, p in zip(ys, shown, strict=True)]
                color = _COLORS.get(metric.value, "#1f77b4")
                label = f"{run.run.label} {metric.value}" if len(report.runs) > 1 else metric.value
                ax.errorbar(xs, ys, yerr=[low, high], fmt="o-", color=color, alpha=0.7, capsize=3, label=label)
        if report.cascade is not None and report.cascade.point.cost_per_task_usd is not None:
            c = report.cascade.point
            cx, cy = float(c.cost_per_task_usd or 0.0), 100 * float(c.value or 0.0)
            ax.scatter([cx], [cy], marker="*", s=120, color="black")
            ax.annotate(
                "cascade",
                (cx, cy),
                xytext=(6, 4),
                textcoords="offset points",
                fontsize=8,
            )
        front = [points[label] for label in report.frontier]
        ax.step(
            [float(p.cost_per_task_usd or 0.0) for p in front],
            [100 * float(p.value or 0.0) for p in front],
            where="post",
            color="#ff7f0e",
            linestyle="--",
            alpha=0.8,
            label="Pareto frontier",
        )
        ax.set_xlabel("cost per task (USD)")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-5, 105)
        ax.grid(True, alpha=0.3, zorder=0)
        ax.legend(fontsize=7)
        ax.set_title("accuracy against cost per task, k = 1..K epochs")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
