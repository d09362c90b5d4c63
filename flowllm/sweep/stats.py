"""The statistics of a sweep: each job's accuracy with its interval, each job against a baseline job paired
task by task (difference, 95% interval, p-value, Holm-corrected for the number of comparisons), and the
cost-accuracy Pareto frontier (flowllm/scoring/stats.py does the maths; flowllm/sweep/summary.py shows it).

The baseline is ``sweep.baseline``: a job's number (its folder under the sweep folder, or its position), or an
override that names exactly one job (``provider.model=claude-x``); unset, the first job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from flowllm.engine.recorder import read_json
from flowllm.errors import ConfigError
from flowllm.run.stats import score_map
from flowllm.rundir.layout import RESULT_FILE, TASKS_DIR, RunLayout
from flowllm.rundir.results import TaskResult
from flowllm.scoring.stats import compare_paired, holm

if TYPE_CHECKING:  # the sweep's rows; sweep.py imports this module
    from flowllm.sweep.summary import JobRow, SweepSummary

__all__ = [
    "JobComparison",
    "add_comparisons",
    "baseline_cell",
    "compare_to_baseline",
    "compared",
    "configured_baseline",
    "draw_uncertainty",
    "job_accuracy",
    "job_scores",
    "pareto_front",
    "resolve_baseline",
]

SCORED_STATUSES = ("ok", "interrupted", "budget")  # jobs whose finished tasks were scored


@dataclass
class JobComparison:
    """One job against the baseline, on the tasks both scored."""

    job: str
    n: int
    diff: float | None
    ci95: list[float | None] | None
    test: str
    p_value: float | None
    p_holm: float | None = None
    fixed: int = 0
    broken: int = 0
    verdict: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def significant(self) -> bool:
        return self.p_holm is not None and self.p_holm < 0.05

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "n": self.n,
            "diff": self.diff,
            "ci95": self.ci95,
            "test": self.test,
            "p_value": self.p_value,
            "p_holm": self.p_holm,
            "significant_after_holm": self.significant,
            "fixed": self.fixed,
            "broken": self.broken,
            "verdict": self.verdict,
        }

    def cell(self) -> str:
        """``+4.2 [0.8, 7.6] p=0.02 (Holm 0.04)``, in points."""
        if self.diff is None:
            return "no task scored in both"
        if self.ci95 is None or self.p_value is None:
            return f"{100 * self.diff:+.1f}, interval not known (n={self.n})"
        low, high = self.ci95
        assert low is not None and high is not None
        holm_p = "" if self.p_holm is None else f" (Holm {self.p_holm:.3g})"
        return f"{100 * self.diff:+.1f} [{100 * low:.1f}, {100 * high:.1f}] p={self.p_value:.3g}{holm_p}"


def job_scores(job_dir: Path) -> dict[str, float]:
    """task id -> score of a job's scored tasks, from its ``tasks/*/result.json``."""
    results = []
    for path in sorted((job_dir / TASKS_DIR).glob(f"*/{RESULT_FILE}")):
        try:
            data = read_json(path)
        except Exception:
            continue  # a half-written result: the task is not finished
        result = TaskResult.from_dict(data) if isinstance(data, dict) else None
        if result is not None and result.task_id:
            results.append(result)
    return score_map(results)


def resolve_baseline(value: str | int | None, jobs: Sequence[tuple[str, list[str]]]) -> int:
    """The position of the baseline among ``jobs`` ((folder, overrides) in job order); ``ConfigError`` when
    ``value`` names no job, or more than one."""
    if not jobs:
        raise ConfigError("sweep.baseline: the sweep has no job")
    if value is None or str(value).strip() == "":
        return 0
    text = str(value).strip()
    for i, (folder, _) in enumerate(jobs):
        if folder == text:
            return i
    if text.isdigit() and int(text) < len(jobs):
        return int(text)
    matches = [i for i, (_, overrides) in enumerate(jobs) if text in overrides]
    if len(matches) == 1:
        return matches[0]
    names = ", ".join(folder for folder, _ in jobs[:10])
    if matches:
        raise ConfigError(f"sweep.baseline={text} names {len(matches)} jobs, not one: add an override that tells one")
    raise ConfigError(f"sweep.baseline={text} names no job of the sweep (jobs: {names}; or one of their overrides)")


def compare_to_baseline(
    scores: Sequence[dict[str, float] | None], baseline: int, names: Sequence[str]
) -> list[JobComparison | None]:
    """Each job (with scores) against the baseline's scores; the baseline's own entry is None. The p-values are
    Holm-adjusted over all the comparisons made."""
    base = scores[baseline]
    out: list[JobComparison | None] = []
    for i, job in enumerate(scores):
        if i == baseline or job is None or base is None:
            out.append(None)
            continue
        result = compare_paired(base, job)
        data = result.to_dict("the baseline", "this job")
        out.append(
            JobComparison(
                job=names[i],
                n=result.n,
                diff=data["diff"],
                ci95=data["ci95"],
                test=result.test,
                p_value=data["p_value"],
                fixed=result.fixed,
                broken=result.broken,
                verdict=data["verdict"],
            )
        )
    adjusted = holm([c.p_value if c is not None else None for c in out])
    for comparison, q in zip(out, adjusted, strict=True):
        if comparison is not None:
            comparison.p_holm = None if q is None else round(q, 8)
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """The indexes of the points no other point beats: none is as cheap (x) and as accurate (y) with one of
    the two strictly better. Sorted by cost."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((ox <= x and oy >= y) and (ox < x or oy > y) for j, (ox, oy) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))


def configured_baseline(job_dirs: Sequence[Path]) -> str | None:
    """``sweep.baseline`` as the jobs were composed with it (the same in every job: the first readable one)."""
    for job in job_dirs:
        try:
            config = yaml.safe_load(RunLayout(job).config.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        sweep = config.get("sweep") if isinstance(config, dict) else None
        value = sweep.get("baseline") if isinstance(sweep, dict) else None
        return None if value is None else str(value)
    return None


def add_comparisons(summary: SweepSummary, job_dirs: Sequence[Path], baseline: str | None, *, strict: bool) -> None:
    """Each finished job against the baseline (``vs_baseline``), and who is on the Pareto frontier."""
    jobs = summary.jobs
    if not jobs:
        return
    try:
        index = resolve_baseline(baseline, [(j.job, j.overrides) for j in jobs])
    except ConfigError as exc:
        if strict:
            raise
        summary.baseline_error = str(exc)
        index = None
    if index is not None:
        summary.baseline = jobs[index].job
        scores = [job_scores(d) if j.status in SCORED_STATUSES else None for j, d in zip(jobs, job_dirs, strict=True)]
        for job, comparison in zip(jobs, compare_to_baseline(scores, index, [j.job for j in jobs]), strict=True):
            job.vs_baseline = comparison.to_dict() if comparison is not None else None
    # Cost against accuracy compares jobs that ran every task: one its budget or a Ctrl-C cut short is cheaper
    # for having run fewer, not for costing less.
    finished = [j for j in jobs if j.status == "ok" and not j.unfinished and j.accuracy is not None]
    priced = all(j.cost_usd is not None for j in finished)
    points = [(_cost(j, priced), job_accuracy(j)) for j in finished]
    for i in pareto_front(points):
        finished[i].pareto = True


def _cost(job: JobRow, priced: bool) -> float:
    """The x of a job: its cost, or its tokens when some job of the sweep has no price."""
    if priced:
        return float(job.cost_usd or 0.0)
    return float((job.input_tokens or 0) + (job.output_tokens or 0))


def job_accuracy(job: JobRow) -> float:
    """Over scored tasks (the stats' mean) when known, else the summary's accuracy."""
    mean = (job.stats or {}).get("mean")
    return float(mean if mean is not None else job.accuracy or 0.0)


def compared(summary: SweepSummary) -> bool:
    """Whether any job was paired with the baseline on at least one task (else the table has no such column)."""
    return any(j.vs_baseline is not None and j.vs_baseline.get("n") for j in summary.jobs)


def baseline_cell(summary: SweepSummary, job: JobRow) -> str:
    if summary.baseline_error:
        return "-"
    if summary.baseline == job.job:
        return "baseline"
    data = job.vs_baseline
    if data is None:
        return "-"
    return JobComparison(
        job=job.job,
        n=int(data["n"]),
        diff=data["diff"],
        ci95=data["ci95"],
        test=str(data["test"]),
        p_value=data["p_value"],
        p_holm=data["p_holm"],
    ).cell()


def draw_uncertainty(ax: Any, xs: Sequence[float], ys: Sequence[float], jobs: Sequence[JobRow]) -> None:
    """On the accuracy-against-cost axes: each job's 95% interval as an error bar, and the Pareto frontier (the
    jobs that ran every task and no other such job beats on both cost and accuracy) as a step line."""
    lows, highs = [], []
    for y, job in zip(ys, jobs, strict=True):
        ci = (job.stats or {}).get("ci95")
        if ci and ci[0] is not None and ci[1] is not None:
            lows.append(max(0.0, y - 100 * ci[0]))
            highs.append(max(0.0, 100 * ci[1] - y))
        else:
            lows.append(0.0)
            highs.append(0.0)
    ax.errorbar(xs, ys, yerr=[lows, highs], fmt="none", ecolor="#1f77b4", alpha=0.5, capsize=3, zorder=2)
    front = sorted((i for i, job in enumerate(jobs) if job.pareto), key=lambda i: (xs[i], ys[i]))  # add_comparisons'
    if front:
        ax.step(
            [xs[i] for i in front],
            [ys[i] for i in front],
            where="post",
            color="#d62728",
            linewidth=1.2,
            label="Pareto frontier (cost, accuracy)",
            zorder=1,
        )
        ax.legend(loc="lower right", fontsize=8)
