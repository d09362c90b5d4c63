"""``summary.json → stats``: the run's accuracy and every breakdown with its uncertainty
(flowllm/scoring/stats.py does the maths; this module picks the figures out of a run's outcomes).

A task counts when it was scored (flowllm/scoring/tally.py's rule, the tally's too): its score (its verdict, or
its epochs reduced by ``experiment.epoch_reducer``) is known. A task with ``correct`` null (no ground truth, a
replay that neither replayed exactly nor forked) or a scoring error is left out of ``n``, and ``unscored`` says
how many were; a task the run's budget stopped is unfinished and counted in neither.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from flowllm.config.schema import IntervalMethod, Reducer
from flowllm.datasets.task import Task
from flowllm.errors import ConfigError
from flowllm.run.epochs import epoch_verdict
from flowllm.rundir.results import RunSummary, StatsBlock, TaskResult
from flowllm.scoring.stats import CONFIDENCE, Estimate, StatsSettings, TaskScore, estimate, format_estimate, pass_curves
from flowllm.scoring.tally import finished, known_score

__all__ = ["check_stats", "run_stats", "score_map", "stats_rows", "stats_settings", "task_scores"]

LEVEL = "level"


class ScoredOutcome(Protocol):
    """What the statistics read of a task's outcome (flowllm.run.outcome.TaskOutcome)."""

    task_id: str
    status: str
    correct: bool | None
    level: int | None
    epochs: int
    epoch_log: list[dict[str, Any]]
    replay: dict[str, Any] | None

    @property
    def task_score(self) -> float | None: ...  # tally.known_score of the outcome


def stats_settings(cfg: Any) -> StatsSettings:
    """``stats.*`` of the config as settings (``cfg`` is the ``stats`` node)."""
    return StatsSettings(
        interval=IntervalMethod(cfg.interval),
        cluster_by=cfg.cluster_by or None,
        resamples=int(cfg.resamples),
        seed=int(cfg.seed),
    )


def check_stats(cfg: Any, tasks: Sequence[Task]) -> None:
    """One line for settings that cannot work: a cluster field no task has, a bootstrap of no resamples."""
    settings = stats_settings(cfg)
    if settings.resamples < 100:
        raise ConfigError(f"stats.resamples must be at least 100, not {settings.resamples}")
    field = settings.cluster_by
    if field is None or field == LEVEL:
        return
    if not any(field in task.metadata for task in tasks):
        known = sorted({k for t in tasks for k in t.metadata})
        raise ConfigError(
            f"stats.cluster_by: the dataset has no field {field!r} (its fields: {', '.join([LEVEL, *known])})"
        )


def _field_value(task: Task | None, outcome: ScoredOutcome, name: str) -> Any:
    if name == LEVEL:
        return outcome.level
    return None if task is None else task.metadata.get(name)


def task_scores(
    outcomes: Iterable[ScoredOutcome], tasks: Sequence[Task], fields: Iterable[str]
) -> tuple[list[TaskScore], int]:
    """The scored tasks with their field values, and how many finished tasks were not scored."""
    by_id = {t.task_id: t for t in tasks}
    names = list(dict.fromkeys([LEVEL, *fields]))
    scored: list[TaskScore] = []
    unscored = 0
    for outcome in finished(outcomes):
        score = outcome.task_score
        if score is None:
            unscored += 1
            continue
        task = by_id.get(outcome.task_id)
        verdicts = tuple(epoch_verdict(e) for e in outcome.epoch_log) if outcome.epochs > 1 else (score == 1.0,)
        values = {name: _field_value(task, outcome, name) for name in names}
        scored.append(TaskScore(outcome.task_id, score, verdicts, values))
    return scored, unscored


def _group(tasks: Sequence[TaskScore], name: str) -> dict[str, list[TaskScore]]:
    groups: dict[str, list[TaskScore]] = {}
    for task in tasks:
        groups.setdefault(str(task.fields.get(name)), []).append(task)
    return dict(sorted(groups.items()))


def run_stats(
    outcomes: Iterable[ScoredOutcome],
    tasks: Sequence[Task],
    *,
    epochs: int,
    reducer: Reducer,
    settings: StatsSettings,
    breakdown: Iterable[str] = (),
) -> dict[str, Any]:
    """The ``stats`` block of ``summary.json``."""
    fields = [f for f in dict.fromkeys(breakdown) if f != LEVEL]
    extra = [settings.cluster_by] if settings.cluster_by else []
    scored, unscored = task_scores(outcomes, tasks, [*fields, *extra])

    def est(group: Sequence[TaskScore]) -> dict[str, Any]:
        return estimate(group, epochs=epochs, settings=settings).to_dict()

    out: dict[str, Any] = {
        "confidence": CONFIDENCE,
        "epochs": epochs,
        "epoch_reducer": str(reducer),
        "interval_requested": str(settings.interval),
        "bootstrap": {"resamples": settings.resamples, "seed": settings.seed}
        if settings.interval is IntervalMethod.bootstrap
        else None,
        "cluster_by": settings.cluster_by,
        "scored": len(scored),
        "unscored": unscored,
        "accuracy": est(scored),
        "by_level": {level: est(group) for level, group in _group(scored, LEVEL).items()},
        "by_field": {name: {v: est(g) for v, g in _group(scored, name).items()} for name in fields},
    }
    if epochs > 1:
        out.update(pass_curves(scored, epochs))
    return out


def score_map(results: Iterable[TaskResult | Mapping[str, Any]]) -> dict[str, float]:
    """task id -> score of the scored tasks among ``result.json`` records (for paired comparisons)."""
    scores: dict[str, float] = {}
    for data in results:
        result = TaskResult.coerce(data)
        value = known_score(
            status=result.status,
            replay=result.replay if isinstance(result.replay, Mapping) else None,
            correct=result.correct if isinstance(result.correct, bool) else None,
            score_error=result.score_error,
            epochs=int(result.epochs or 1),
            score=result.score,
        )
        if value is not None:
            scores[str(result.task_id)] = value
    return scores


def stats_rows(summary: RunSummary | Mapping[str, Any]) -> list[tuple[str, str]]:
    """The console's rows for ``summary.json → stats``: the accuracy over scored tasks with its standard error
    and 95% interval, per level, and the epochs' pass@k / pass^k."""
    stats = RunSummary.coerce(summary).stats
    if not isinstance(stats, StatsBlock):
        return []
    acc = Estimate.from_dict(stats.accuracy)
    how = acc.interval or "none"
    se = f"clustered by {stats.cluster_by}" if acc.stderr_method == "clustered" else "CLT"
    rows = [("accuracy ± SE [95% CI]", f"{format_estimate(stats.accuracy)} ({how} interval, {se} SE)")]
    for level, est in stats.by_level.items():
        name = "no level" if level == "None" else f"level {level}"
        rows.append((f"  {name}", format_estimate(est)))
    epochs = int(stats.epochs or 1)
    if epochs > 1:
        within = acc.within_task_var
        noise = "not known" if within is None else f"{within:.4f}"
        unscored = f", {stats.unscored} unscored" if stats.unscored else ""
        rows.append(
            (
                "epochs",
                f"{epochs} per task, reduced by {stats.epoch_reducer}; within-task variance {noise}{unscored}",
            )
        )
        for curve, label in ((stats.pass_at_k, "pass@k"), (stats.pass_hat_k, "pass^k")):
            shown = ", ".join(f"k={k}: {'-' if v is None else f'{v:.1%}'}" for k, v in (curve or {}).items())
            rows.append((label, shown))
    return rows
