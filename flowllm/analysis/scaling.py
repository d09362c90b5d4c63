"""Test-time scaling from saved epochs, with no model call: accuracy against cost for k = 1..K epochs per task.

For each task with n scored epochs (c of them correct) and each k <= n, averaged over the k-subsets of its
epochs (so every figure is an unbiased estimate, not the luck of the first k epochs):

* ``majority@k``: the majority answer of the k epochs is correct (a tie goes to the answer of the earliest epoch
  among the tied ones, as ``experiment.epoch_reducer=majority`` does);
* ``pass@k``: at least one of the k is correct (Chen et al. 2021: ``1 - C(n-c, k) / C(n, k)``);
* ``pass^k``: all k are correct (``C(c, k) / C(n, k)``);
* ``mean@k``: the mean verdict of the k (``c / n`` for every k: more epochs narrow it, they do not raise it).

A figure is the mean over the tasks with at least k scored epochs; its interval is a seeded percentile bootstrap
over tasks (the same resampled tasks for every figure). The cost per task of k epochs is k times the task's mean
cost per epoch (from the ledger), averaged over the same tasks. ``cascade`` answers each task with the cheapest
run and escalates to the next when its epochs agree less than a threshold.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from flowllm.analysis.epoch_runs import EpochOutcome, RunEpochs, TaskEpochs
from flowllm.scoring.stats import ALPHA, DEFAULT_RESAMPLES, DEFAULT_SEED, pass_at_k, pass_hat_k

__all__ = [
    "EPOCH_METRICS",
    "Bootstrap",
    "Cascade",
    "Metric",
    "Point",
    "RunCurves",
    "agreement",
    "cascade",
    "majority_at_k",
    "majority_curve",
    "majority_verdict",
    "run_curves",
]


class Metric(StrEnum):
    majority = "majority@k"
    pass_at = "pass@k"
    pass_hat = "pass^k"
    mean = "mean@k"
    best = "best-of-k"  # a judge picks among the first k epochs' answers (flowllm/analysis/rerank.py)


EPOCH_METRICS = (Metric.majority, Metric.pass_at, Metric.pass_hat, Metric.mean)  # computed from the epochs alone


@dataclass(frozen=True)
class Bootstrap:
    """How intervals are drawn: a percentile bootstrap resampling tasks, seeded (the same runs, the same figures)."""

    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED
    confidence: float = 1 - ALPHA

    def describe(self) -> dict[str, Any]:
        return {
            "method": "percentile bootstrap over tasks",
            "resamples": self.resamples,
            "seed": self.seed,
            "confidence": self.confidence,
        }

    def interval(self, values: Sequence[float]) -> list[float] | None:
        """The interval of the mean of ``values``; None for fewer than two values."""
        if len(values) < 2:
            return None
        import numpy as np

        rng = np.random.default_rng(self.seed)
        data = np.asarray(values, dtype=float)
        means = data[rng.integers(0, len(data), size=(self.resamples, len(data)))].mean(axis=1)
        tail = 100 * (1 - self.confidence) / 2
        low, high = np.percentile(means, [tail, 100 - tail])
        return [float(low), float(high)]


@dataclass(frozen=True)
class Point:
    """One figure: its value over ``n`` tasks, its interval, and the cost per task it took."""

    value: float | None
    ci: list[float] | None
    n: int
    cost_per_task_usd: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "ci": self.ci, "n": self.n, "cost_per_task_usd": self.cost_per_task_usd}


@dataclass
class RunCurves:
    """One run's figures: metric -> k -> Point."""

    run: RunEpochs
    tasks: list[str]
    curves: dict[Metric, dict[int, Point]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.run.label,
            "path": str(self.run.path),
            "epochs": self.run.epochs,
            "tasks": len(self.tasks),
            "curves": {m.value: {str(k): p.to_dict() for k, p in by_k.items()} for m, by_k in self.curves.items()},
        }


def majority_verdict(epochs: Sequence[EpochOutcome]) -> bool:
    """The verdict of the most frequent answer; a tie goes to the tied answer seen first."""
    counts = Counter(e.answer for e in epochs)
    top = max(counts.values())
    return next(e.correct for e in epochs if counts[e.answer] == top)


def agreement(epochs: Sequence[EpochOutcome]) -> float:
    """The share of epochs that give the most frequent answer."""
    return max(Counter(e.answer for e in epochs).values()) / len(epochs)


def majority_curve(task: TaskEpochs) -> list[float]:
    """majority@k of one task for k = 1..n (index k - 1): the mean over its epochs' k-subsets of the majority's
    verdict, counted without listing the subsets (there are C(n, k): 1.8e18 at 64 epochs and k = 32).

    A subset's majority is answer i with its first chosen epoch at position p and x of its epochs chosen when every
    other answer j has fewer than x chosen, or exactly x all after p (the tie goes to the earliest). For each
    (i, p, x), the ways the other answers fill the rest of the subset are the coefficients of the product over j
    of ``sum_{y<x} C(m_j, y) t^y + C(after_j(p), x) t^x``; only positions whose epoch is correct add to the sum.
    """
    import numpy as np

    epochs = task.epochs
    n = len(epochs)
    positions: dict[str, list[int]] = {}
    for index, epoch in enumerate(epochs):
        positions.setdefault(epoch.answer, []).append(index)
    won = np.zeros(n + 1)  # won[k]: the k-subsets whose majority is correct
    for answer, mine in positions.items():
        others = [theirs for other, theirs in positions.items() if other != answer]
        for rank, first in enumerate(mine):
            if not epochs[first].correct:
                continue
            later = len(mine) - rank - 1  # this answer's epochs after its first chosen one
            for x in range(1, later + 2):
                ways = np.array([float(math.comb(later, x - 1))])
                for theirs in others:
                    after = len(theirs) - bisect.bisect_right(theirs, first)
                    fill = [math.comb(len(theirs), y) for y in range(x)] + [math.comb(after, x)]
                    ways = np.convolve(ways, np.array(fill, dtype=float))[: n - x + 1]
                won[x : x + len(ways)] += ways
    return [float(won[k]) / math.comb(n, k) for k in range(1, n + 1)]


def majority_at_k(task: TaskEpochs, k: int) -> float:
    """majority@k of one task (``majority_curve`` at k)."""
    return majority_curve(task)[k - 1]


def _task_value(metric: Metric, task: TaskEpochs, k: int, majorities: dict[str, list[float]]) -> float:
    if metric is Metric.majority:
        return majorities[task.task_id][k - 1]
    if metric is Metric.pass_at:
        return pass_at_k(task.n, task.c, k)
    if metric is Metric.pass_hat:
        return pass_hat_k(task.n, task.c, k)
    return task.c / task.n


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _cost(tasks: Sequence[TaskEpochs], k: int) -> float | None:
    costs = [t.epoch_cost_usd for t in tasks]
    if any(c is None for c in costs):
        return None
    return _mean([k * float(c) for c in costs if c is not None])


def run_curves(run: RunEpochs, task_ids: Sequence[str], max_k: int, bootstrap: Bootstrap) -> RunCurves:
    """Every metric for k = 1..max_k over ``task_ids`` (those with at least k scored epochs at each k)."""
    out = RunCurves(run, list(task_ids))
    majorities = {t: majority_curve(run.tasks[t]) for t in task_ids}  # every k of a task at once
    for metric in EPOCH_METRICS:
        out.curves[metric] = {}
        for k in range(1, max_k + 1):
            tasks = [run.tasks[t] for t in task_ids if run.tasks[t].n >= k]
            values = [_task_value(metric, t, k, majorities) for t in tasks]
            out.curves[metric][k] = Point(_mean(values), bootstrap.interval(values), len(values), _cost(tasks, k))
    return out


@dataclass
class Cascade:
    """Each task answered by the first run (cheapest first) whose epochs agree at least ``threshold`` (the last
    run always answers): the accuracy, the cost per task (every run asked, all its epochs) and how many tasks
    each run answered."""

    order: list[str]
    threshold: float
    point: Point
    answered_by: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "agreement": self.threshold,
            **self.point.to_dict(),
            "answered_by": self.answered_by,
        }


def cascade(runs: Sequence[RunEpochs], task_ids: Sequence[str], threshold: float, bootstrap: Bootstrap) -> Cascade:
    """The cascade over ``runs`` ordered by cost per task (unpriced runs last, then as given)."""

    def run_cost(run: RunEpochs) -> tuple[int, float]:
        cost = _cost([run.tasks[t] for t in task_ids], run.epochs)
        return (1, 0.0) if cost is None else (0, cost)

    ordered = sorted(runs, key=run_cost)
    values: list[float] = []
    costs: list[float | None] = []
    answered = dict.fromkeys((r.label for r in ordered), 0)
    for task_id in task_ids:
        spent: float | None = 0.0
        for i, run in enumerate(ordered):
            task = run.tasks[task_id]
            spent = None if spent is None or task.cost_usd is None else spent + task.cost_usd
            if agreement(task.epochs) >= threshold or i == len(ordered) - 1:
                values.append(float(majority_verdict(task.epochs)))
                answered[run.label] += 1
                break
        costs.append(spent)
    known = [c for c in costs if c is not None]
    cost = _mean(known) if len(known) == len(costs) else None
    point = Point(_mean(values), bootstrap.interval(values), len(values), cost)
    return Cascade([r.label for r in ordered], threshold, point, answered)
