"""The statistics of a run's scores: every accuracy with its uncertainty, every comparison with its significance.

A task's *score* is its epochs' verdicts reduced to one number in [0, 1] (``Reducer``); a task with no scored
epoch (``correct`` null: no ground truth, a diverged replay) is not scored and is left out of ``n``. On the
per-task scores:

* ``estimate``: the mean, its standard error (the CLT estimate ``sd / sqrt(n)``, or the cluster-robust one of an
  intercept-only regression when tasks are clustered by a dataset field), a 95% interval (Wilson for binary
  scores, normal otherwise, t with G - 1 degrees of freedom over G clusters, or a percentile bootstrap with a
  fixed seed) and the within-task variance across
  epochs. Fewer than two scored tasks: no standard error and no interval (``None``: not known, never 0).
* ``pass_at_k`` (the unbiased estimator of Chen et al. 2021) and ``pass_hat_k`` (pass^k: all k draws correct).
* ``compare_paired``: two runs task by task, McNemar's exact test for binary scores and a paired t-test for
  fractional ones, the paired difference's t interval (df n - 1), and the tasks needed to detect it at 80%
  power.
* ``plan_power``: tasks x epochs needed to detect a difference before spending anything.

The figures come from scipy.stats and statsmodels (imported when first needed: they take a second to load).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowllm.config.schema import IntervalMethod, Reducer
from flowllm.scoring.scorers import normalize_answer

CONFIDENCE = 0.95
POWER = 0.80
ALPHA = 1 - CONFIDENCE
DEFAULT_RESAMPLES = 2000
# The normal quantile of the 95% interval, Phi^-1(1 - ALPHA / 2), as scipy computes it (``norm.isf(ALPHA / 2)`` and
# ``norm.ppf(1 - ALPHA / 2)`` give this same float; a test holds them equal). A literal: a run's summary need not
# import scipy, which takes about a second.
Z_95 = 1.959963984540054
DEFAULT_SEED = 0

__all__ = [
    "Estimate",
    "IntervalMethod",
    "PairedComparison",
    "PowerPlan",
    "Reducer",
    "StatsSettings",
    "TaskScore",
    "compare_paired",
    "estimate",
    "format_estimate",
    "holm",
    "pass_at_k",
    "pass_hat_k",
    "plan_power",
    "reduce_epochs",
]


@dataclass(frozen=True)
class StatsSettings:
    interval: IntervalMethod = IntervalMethod.wilson
    cluster_by: str | None = None
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED


@dataclass(frozen=True)
class TaskScore:
    """One scored task: its reduced score, its epochs' verdicts (None: that epoch was not scored) and its
    values of the dataset's fields (level, category...), for breakdowns and clusters."""

    task_id: str
    score: float
    epochs: tuple[bool | None, ...] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def scored_epochs(self) -> list[bool]:
        return [e for e in self.epochs if e is not None]


def reduce_epochs(verdicts: Sequence[bool | None], answers: Sequence[str | None], reducer: Reducer) -> float | None:
    """A task's score from its epochs; None when no epoch was scored. ``answers`` are normalised answers,
    aligned with ``verdicts`` (used by ``majority``: the most frequent answer among scored epochs wins; a tie
    goes to the answer seen first)."""
    scored = [(v, a) for v, a in zip(verdicts, answers, strict=True) if v is not None]
    if not scored:
        return None
    if reducer is Reducer.mean:
        return sum(v for v, _ in scored) / len(scored)
    if reducer is Reducer.max:
        return float(any(v for v, _ in scored))
    if reducer is Reducer.all:
        return float(all(v for v, _ in scored))
    winner = most_frequent([a for _, a in scored])
    return float(next(v for v, a in scored if a == winner))


def most_frequent(answers: Sequence[str | None]) -> str | None:
    """The answer given most often (``majority``'s vote); a tie goes to the answer seen first. None: no answers."""
    if not answers:
        return None
    counts = Counter(answers)
    return max(counts, key=lambda a: (counts[a], -answers.index(a)))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task (Chen et al. 2021): the chance that k of its n samples, drawn without
    replacement, hold at least one of its c correct ones: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k (tau-bench): the chance that k of the n samples, drawn without replacement, are all correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass^k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    return math.comb(c, k) / math.comb(n, k)


def pass_curves(tasks: Sequence[TaskScore], epochs: int) -> dict[str, dict[str, float | None]]:
    """``pass@k`` and ``pass^k`` for k = 1..epochs, averaged over tasks with at least k scored epochs."""
    curves: dict[str, dict[str, float | None]] = {"pass_at_k": {}, "pass_hat_k": {}}
    for k in range(1, epochs + 1):
        counts = [(len(s), sum(s)) for s in (t.scored_epochs for t in tasks) if len(s) >= k]
        at = [pass_at_k(n, c, k) for n, c in counts]
        hat = [pass_hat_k(n, c, k) for n, c in counts]
        # Unrounded, as the mean is: rounded once where shown (pass@1 and the mean are the same figure).
        curves["pass_at_k"][str(k)] = sum(at) / len(at) if at else None
        curves["pass_hat_k"][str(k)] = sum(hat) / len(hat) if hat else None
    return curves


@dataclass(frozen=True)
class Estimate:
    """A mean over scored tasks with its uncertainty; None is "not known" (fewer than two scored tasks)."""

    n: int
    epochs: int
    mean: float | None
    stderr: float | None
    ci_low: float | None
    ci_high: float | None
    interval: str  # wilson | clt | bootstrap: what the interval is
    stderr_method: str  # clt | clustered
    cluster_by: str | None = None
    clusters: int | None = None
    within_task_var: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "epochs": self.epochs,
            "mean": _number(self.mean),
            "stderr": _number(self.stderr),
            "ci95": [_number(self.ci_low), _number(self.ci_high)] if self.ci_low is not None else None,
            "interval": self.interval,
            "stderr_method": self.stderr_method,
            "cluster_by": self.cluster_by,
            "clusters": self.clusters,
            "within_task_var": _number(self.within_task_var),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Estimate:
        ci = data.get("ci95") or [None, None]
        return cls(
            n=int(data.get("n") or 0),
            epochs=int(data.get("epochs") or 1),
            mean=data.get("mean"),
            stderr=data.get("stderr"),
            ci_low=ci[0],
            ci_high=ci[1],
            interval=str(data.get("interval") or ""),
            stderr_method=str(data.get("stderr_method") or ""),
            cluster_by=data.get("cluster_by"),
            clusters=data.get("clusters"),
            within_task_var=data.get("within_task_var"),
        )


def _number(value: float | None) -> float | None:
    """A figure for ``summary.json``, unrounded: it is rounded once, where it is shown."""
    return None if value is None else float(value)


def _is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def _clustered_stderr(values: Sequence[float], groups: Sequence[str]) -> float:
    """The cluster-robust standard error of the mean (an intercept-only OLS, statsmodels' cluster covariance,
    with its small-sample correction G/(G-1) * (N-1)/(N-1))."""
    import numpy as np
    import statsmodels.api as sm

    codes = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    fit = sm.OLS(np.asarray(values, dtype=float), np.ones((len(values), 1))).fit(
        cov_type="cluster", cov_kwds={"groups": np.asarray([codes[g] for g in groups])}
    )
    return float(fit.bse[0])


def _wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """The Wilson score interval at 95%: statsmodels' ``proportion_confint(method="wilson")``, the same operations
    in the same order (a test holds them equal bit for bit), without importing statsmodels."""
    q = successes / n
    crit2 = Z_95**2
    denom = 1 + crit2 / n
    center = (q + crit2 / (2 * n)) / denom
    dist = Z_95 * math.sqrt(q * (1.0 - q) / n + crit2 / (4.0 * n**2))
    dist /= denom
    return min(1.0, max(0.0, center - dist)), min(1.0, max(0.0, center + dist))


def _bootstrap_interval(
    values: Sequence[float], groups: Sequence[str] | None, settings: StatsSettings
) -> tuple[float, float]:
    """A percentile bootstrap of the mean, resampling tasks (or whole clusters), seeded: the same run gives the
    same interval."""
    import numpy as np

    rng = np.random.default_rng(settings.seed)
    data = np.asarray(values, dtype=float)
    if groups is None:
        draws = rng.integers(0, len(data), size=(settings.resamples, len(data)))
        means = data[draws].mean(axis=1)
    else:
        names = list(dict.fromkeys(groups))
        sums = np.asarray([sum(v for v, g in zip(values, groups, strict=True) if g == n) for n in names])
        sizes = np.asarray([sum(1 for g in groups if g == n) for n in names], dtype=float)
        draws = rng.integers(0, len(names), size=(settings.resamples, len(names)))
        means = sums[draws].sum(axis=1) / sizes[draws].sum(axis=1)
    low, high = np.percentile(means, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
    return float(low), float(high)


def estimate(tasks: Sequence[TaskScore], *, epochs: int = 1, settings: StatsSettings | None = None) -> Estimate:
    """The mean score of ``tasks`` (all scored) with its standard error and 95% interval."""
    settings = settings or StatsSettings()
    values = [t.score for t in tasks]
    n = len(values)
    cluster_by = settings.cluster_by
    groups = [str(t.fields.get(cluster_by)) for t in tasks] if cluster_by else None
    clusters = len(set(groups)) if groups is not None else None
    within = _within_task_var(tasks) if epochs > 1 else None
    stderr_method = "clustered" if cluster_by else "clt"
    if n == 0:
        return Estimate(0, epochs, None, None, None, None, "none", stderr_method, cluster_by, clusters, within)
    mean = sum(values) / n
    if n < 2:
        return Estimate(n, epochs, mean, None, None, None, "none", stderr_method, cluster_by, clusters, within)
    if groups is not None and clusters is not None and clusters >= 2:
        stderr = _clustered_stderr(values, groups)
    elif groups is not None:  # one cluster: its spread cannot be estimated
        stderr = None
    else:
        stderr = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    method = settings.interval
    low: float | None
    high: float | None
    if method is IntervalMethod.bootstrap:
        low, high = _bootstrap_interval(values, groups, settings)
        interval = "bootstrap"
    elif method is IntervalMethod.wilson and groups is None and _is_binary(values):
        low, high = _wilson_interval(int(sum(values)), n)
        interval = "wilson"
    elif stderr is None:
        low = high = None
        interval = "none"
    else:
        # Clustered: t with G - 1 degrees of freedom (G clusters), as the sandwich estimate has; else normal.
        crit = Z_95
        if clusters is not None:
            from scipy import stats as sps

            crit = float(sps.t.ppf(1 - ALPHA / 2, clusters - 1))
        low, high = max(0.0, mean - float(crit) * stderr), min(1.0, mean + float(crit) * stderr)
        interval = "clt"
    return Estimate(n, epochs, mean, stderr, low, high, interval, stderr_method, cluster_by, clusters, within)


def _within_task_var(tasks: Sequence[TaskScore]) -> float | None:
    """The mean over tasks of the variance of their epochs' verdicts (ddof=1), over tasks with two or more
    scored epochs; None when no task has two."""
    variances = []
    for task in tasks:
        scored = task.scored_epochs
        if len(scored) >= 2:
            m = sum(scored) / len(scored)
            variances.append(sum((s - m) ** 2 for s in scored) / (len(scored) - 1))
    return sum(variances) / len(variances) if variances else None


def format_estimate(data: Mapping[str, Any] | Estimate | None, *, digits: int = 1) -> str:
    """``62.4% ± 3.8 [55.0, 69.8] n=120``: the mean, its standard error and its 95% interval in points; what
    is not known says so."""
    est = data if isinstance(data, Estimate) or data is None else Estimate.from_dict(data)
    if est is None or est.mean is None:
        return "not known (no scored task)"
    mean = f"{100 * est.mean:.{digits}f}%"
    se = "not known" if est.stderr is None else f"{100 * est.stderr:.{digits}f}"
    if est.ci_low is None or est.ci_high is None:
        return f"{mean} ± {se}, 95% CI not known, n={est.n}"
    return f"{mean} ± {se} [{100 * est.ci_low:.{digits}f}, {100 * est.ci_high:.{digits}f}] n={est.n}"


# -- paired comparison -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedComparison:
    """B against A on the tasks both scored: ``diff`` is mean(B) - mean(A)."""

    n: int
    mean_a: float | None
    mean_b: float | None
    diff: float | None
    stderr: float | None
    ci_low: float | None
    ci_high: float | None
    test: str  # mcnemar-exact | paired-t | sign-exact (every task moved by the same amount) | none
    p_value: float | None
    fixed: int  # scored better in B
    broken: int  # scored worse in B
    unchanged: int
    tasks_needed: int | None  # to detect the observed difference at 80% power (when not significant)

    @property
    def significant(self) -> bool:
        return self.p_value is not None and self.p_value < ALPHA

    def verdict(self, a: str = "A", b: str = "B") -> str:
        if self.n == 0 or self.diff is None:
            return "no task scored in both runs: nothing to compare"
        points = 100 * abs(self.diff)
        if self.ci_low is None or self.ci_high is None or self.p_value is None:
            return f"not known: {self.n} task scored in both runs, too few to estimate the noise"
        ci = f"95% CI [{100 * self.ci_low:.1f}, {100 * self.ci_high:.1f}]"
        p = f"p = {_format_p(self.p_value)}"
        if self.significant and self.diff != 0:
            lead = b if self.diff > 0 else a
            return f"{lead} is ahead by {points:.1f} points, {ci}, {p}"
        need = ""
        if self.tasks_needed is not None:
            need = f"; about {self.tasks_needed} paired tasks would detect a {points:.1f}-point difference at 80% power"
        elif self.diff == 0:
            need = "; no difference was observed, so no size can be named to detect it"
        shown = f"{100 * self.diff:+.1f} points"  # signed: a decline reads as one
        return f"not distinguishable from noise at this size ({self.n} tasks): {shown}, {ci}, {p}{need}"

    def to_dict(self, a: str = "A", b: str = "B") -> dict[str, Any]:
        return {
            "n": self.n,
            "mean_a": _number(self.mean_a),
            "mean_b": _number(self.mean_b),
            "diff": _number(self.diff),
            "stderr": _number(self.stderr),
            "ci95": [_number(self.ci_low), _number(self.ci_high)] if self.ci_low is not None else None,
            "test": self.test,
            "p_value": _number(self.p_value),
            "significant": self.significant,
            "fixed": self.fixed,
            "broken": self.broken,
            "unchanged": self.unchanged,
            "tasks_needed_80_power": self.tasks_needed,
            "verdict": self.verdict(a, b),
        }


def _format_p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.01 else f"{p:.2f}"


SPREAD_NOISE = 1e-12  # a spread of per-task differences this small is float rounding, not a spread


def compare_paired(a: Mapping[str, float], b: Mapping[str, float]) -> PairedComparison:
    """Pair two runs' per-task scores on the tasks both scored (the keys both hold)."""
    from scipy import stats as sps

    common = [t for t in a if t in b]
    xa = [float(a[t]) for t in common]
    xb = [float(b[t]) for t in common]
    n = len(common)
    fixed = sum(1 for u, v in zip(xa, xb, strict=True) if v > u)
    broken = sum(1 for u, v in zip(xa, xb, strict=True) if v < u)
    unchanged = n - fixed - broken
    if n == 0:
        return PairedComparison(0, None, None, None, None, None, None, "none", None, 0, 0, 0, None)
    mean_a, mean_b = sum(xa) / n, sum(xb) / n
    diff = mean_b - mean_a
    if n < 2:
        return PairedComparison(n, mean_a, mean_b, diff, None, None, None, "none", None, fixed, broken, unchanged, None)
    d = [v - u for u, v in zip(xa, xb, strict=True)]
    sd = math.sqrt(sum((x - diff) ** 2 for x in d) / (n - 1))
    if sd <= SPREAD_NOISE * max(1.0, abs(diff)):  # epochs' means (thirds...) differ in their last bits only
        sd = 0.0
    stderr = sd / math.sqrt(n)
    # The paired t interval (df n - 1): the one the paired t-test's p goes with (it excludes 0 exactly when
    # p < 0.05); binary scores get it too, beside McNemar's exact p, rather than a narrower normal interval.
    t = float(sps.t.ppf(1 - ALPHA / 2, n - 1))
    low, high = diff - t * stderr, diff + t * stderr
    if _is_binary(xa) and _is_binary(xb):
        from statsmodels.stats.contingency_tables import mcnemar

        both = sum(1 for u, v in zip(xa, xb, strict=True) if u == v == 1.0)
        neither = sum(1 for u, v in zip(xa, xb, strict=True) if u == v == 0.0)
        p = float(mcnemar([[both, broken], [fixed, neither]], exact=True).pvalue)
        test = "mcnemar-exact"
    elif sd == 0 and diff == 0:  # nothing moved
        p, test = 1.0, "paired-t"
    elif sd == 0:  # every task moved by the same amount: no spread for a t-test; the exact sign test (not p = 0:
        p, test = min(1.0, 2 * 0.5**n), "sign-exact"  # all n moved one way, 3 tasks give 0.25)
    else:
        p = float(sps.ttest_rel(xb, xa).pvalue)
        test = "paired-t"
    needed = None
    if p >= ALPHA and diff != 0 and sd > 0:
        needed = tasks_for_power(abs(diff), sd)
    return PairedComparison(n, mean_a, mean_b, diff, stderr, low, high, test, p, fixed, broken, unchanged, needed)


def tasks_for_power(delta: float, sd_diff: float, *, power: float = POWER, alpha: float = ALPHA) -> int:
    """Paired tasks a two-sided paired t-test needs to detect a mean difference ``delta`` whose per-task
    differences have standard deviation ``sd_diff`` (statsmodels' TTestPower)."""
    from statsmodels.stats.power import TTestPower

    if delta <= 0 or sd_diff <= 0:
        raise ValueError("the difference and its standard deviation must be positive")
    n = TTestPower().solve_power(effect_size=delta / sd_diff, power=power, alpha=alpha, alternative="two-sided")
    return max(2, math.ceil(float(n)))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values (statsmodels' multipletests); None stays None and is not counted."""
    from statsmodels.stats.multitest import multipletests

    known = [(i, p) for i, p in enumerate(p_values) if p is not None]
    out: list[float | None] = [None] * len(p_values)
    if known:
        adjusted = multipletests([p for _, p in known], alpha=ALPHA, method="holm")[1]
        for (i, _), q in zip(known, adjusted, strict=True):
            out[i] = float(q)
    return out


# -- power before spending ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerPlan:
    """Tasks needed per run to tell ``baseline`` from ``baseline + delta`` at 80% power (two-sided, 5%)."""

    baseline: float
    delta: float
    epochs: int
    within_var: float
    task_var: float  # the variance of one task's score averaged over its epochs, per run
    tasks: int
    cost_per_task_epoch: float | None = None

    @property
    def cost_per_run(self) -> float | None:
        if self.cost_per_task_epoch is None:
            return None
        return self.cost_per_task_epoch * self.tasks * self.epochs

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "delta": self.delta,
            "epochs": self.epochs,
            "within_var": _number(self.within_var),
            "task_var": _number(self.task_var),
            "tasks": self.tasks,
            "task_epochs": self.tasks * self.epochs,
            "power": POWER,
            "alpha": ALPHA,
            "cost_per_task_epoch_usd": _number(self.cost_per_task_epoch),
            "cost_per_run_usd": _number(self.cost_per_run),
        }


def plan_power(
    baseline: float,
    delta: float,
    *,
    epochs: int = 1,
    within_var: float = 0.0,
    cost_per_task_epoch: float | None = None,
) -> PowerPlan:
    """Miller (2024), unpaired and so conservative: a task's binary verdict at accuracy p has variance
    p(1-p), of which ``within_var`` is noise between epochs of the same task; averaging k epochs leaves
    ``p(1-p) - within_var * (1 - 1/k)``. Two runs at p and p+delta then need
    ``n = (z_{0.975} + z_{0.8})^2 (var_A + var_B) / delta^2`` tasks each."""
    from scipy import stats as sps

    if not 0 < baseline < 1:
        raise ValueError(f"the baseline accuracy must be between 0 and 1, not {baseline}")
    if not 0 < delta < 1 or baseline + delta > 1:
        raise ValueError(f"the difference must be positive and keep the accuracy at most 1 (baseline {baseline})")
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, not {epochs}")
    if within_var < 0:
        raise ValueError(f"the within-task variance cannot be negative, not {within_var}")

    def var(p: float) -> float:
        total = p * (1 - p)
        return max(total - min(within_var, total) * (1 - 1 / epochs), 1e-12)

    var_a, var_b = var(baseline), var(baseline + delta)
    z = float(sps.norm.ppf(1 - ALPHA / 2) + sps.norm.ppf(POWER))
    tasks = math.ceil(z**2 * (var_a + var_b) / delta**2)
    return PowerPlan(baseline, delta, epochs, within_var, var_a, tasks, cost_per_task_epoch)


def voted_epoch(answers: Sequence[str | None]) -> int | None:
    """The position of the epoch whose answer stands for the task where one answer is wanted (a leaderboard
    submission): the normalised answer the epochs gave most often (empty answers do not vote; a tie goes to the
    earliest), and of the epochs that gave it, the first. None when no epoch gave an answer."""
    normal = [normalize_answer(a) if a else None for a in answers]
    winner = most_frequent([a for a in normal if a])
    return None if winner is None else normal.index(winner)
