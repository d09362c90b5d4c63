"""flowllm.scoring.stats against independent computations: textbook values (Wilson, McNemar, sample sizes),
brute-force enumeration (pass@k, pass^k) and the formulas written out by hand (CLT and clustered errors)."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from flowllm.config.schema import IntervalMethod, Reducer
from flowllm.scoring.stats import (
    ALPHA,
    Z_95,
    StatsSettings,
    TaskScore,
    compare_paired,
    estimate,
    format_estimate,
    holm,
    pass_at_k,
    pass_curves,
    pass_hat_k,
    plan_power,
    reduce_epochs,
    tasks_for_power,
)


def _tasks(values: list[float], groups: list[str] | None = None) -> list[TaskScore]:
    return [TaskScore(f"t{i}", v, (), {"g": groups[i]} if groups else {}) for i, v in enumerate(values)]


@pytest.mark.parametrize(
    ("correct", "n", "low", "high"),
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", table I (Wilson's method).
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_interval_matches_the_textbook(correct: int, n: int, low: float, high: float) -> None:
    est = estimate(_tasks([1.0] * correct + [0.0] * (n - correct)))
    assert est.interval == "wilson"
    assert est.ci_low == pytest.approx(low, abs=6e-5)
    assert est.ci_high == pytest.approx(high, abs=6e-5)
    assert est.mean == pytest.approx(correct / n)


def test_the_wilson_interval_is_statsmodels_bit_for_bit() -> None:
    """The summary computes Wilson's interval without importing statsmodels and scipy: the same floats, so runs
    saved before still verify (their summaries are recomputed and compared)."""
    from scipy import stats as sps
    from statsmodels.stats.proportion import proportion_confint

    assert float(sps.norm.isf(ALPHA / 2)) == Z_95 == float(sps.norm.ppf(1 - ALPHA / 2))
    for n in [*range(2, 80), 120, 165, 263, 300, 466, 1000]:
        for correct in range(n + 1):
            est = estimate(_tasks([1.0] * correct + [0.0] * (n - correct)))
            low, high = proportion_confint(correct, n, alpha=ALPHA, method="wilson")
            assert (est.ci_low, est.ci_high) == (float(low), float(high)), (correct, n)


def test_clt_standard_error_is_the_sample_sd_over_root_n() -> None:
    values = [1.0, 0.0, 0.5, 1.0, 1 / 3, 2 / 3, 0.0, 1.0]
    est = estimate(_tasks(values), settings=StatsSettings(interval=IntervalMethod.wilson))
    se = statistics.stdev(values) / math.sqrt(len(values))
    assert est.stderr == pytest.approx(se)
    assert est.interval == "clt"  # fractional scores: Wilson does not apply, and the JSON says what was used
    mean = statistics.fmean(values)
    assert (est.ci_low, est.ci_high) == pytest.approx((mean - 1.959964 * se, mean + 1.959964 * se), abs=1e-6)


def test_clustered_standard_error_matches_the_sandwich_formula() -> None:
    values = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    groups = ["a", "a", "a", "b", "b", "c", "c", "c", "d", "d"]
    est = estimate(_tasks(values, groups), settings=StatsSettings(cluster_by="g"))
    n, mean = len(values), statistics.fmean(values)
    sums = {g: sum(v - mean for v, h in zip(values, groups, strict=True) if h == g) for g in set(groups)}
    clusters = len(sums)
    variance = clusters / (clusters - 1) * sum(s * s for s in sums.values()) / n**2
    assert est.stderr == pytest.approx(math.sqrt(variance))
    assert est.stderr_method == "clustered" and est.clusters == 4 and est.interval == "clt"


def test_fewer_than_two_scored_tasks_leave_the_interval_unknown_never_zero() -> None:
    for values in ([], [1.0]):
        est = estimate(_tasks(values))
        assert est.stderr is None and est.ci_low is None and est.ci_high is None
        assert est.to_dict()["ci95"] is None
    assert "not known" in format_estimate(estimate(_tasks([1.0])))
    assert format_estimate(estimate(_tasks([]))) == "not known (no scored task)"


def test_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    values = [1.0] * 30 + [0.0] * 20
    settings = StatsSettings(interval=IntervalMethod.bootstrap, resamples=500, seed=7)
    first, again = estimate(_tasks(values), settings=settings), estimate(_tasks(values), settings=settings)
    assert first.interval == "bootstrap"
    assert (first.ci_low, first.ci_high) == (again.ci_low, again.ci_high)
    assert first.ci_low is not None and first.ci_high is not None
    assert first.ci_low < 0.6 < first.ci_high
    # Roughly the normal interval's width at this size.
    assert first.ci_high - first.ci_low == pytest.approx(2 * 1.96 * math.sqrt(0.24 / 50), rel=0.25)


def _brute_pass_at_k(samples: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(samples, k))
    return sum(any(s) for s in subsets) / len(subsets)


def _brute_pass_hat_k(samples: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(samples, k))
    return sum(all(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_pass_at_k_and_pass_hat_k_equal_enumerating_every_subset(n: int) -> None:
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(samples, k))
            assert pass_hat_k(n, c, k) == pytest.approx(_brute_pass_hat_k(samples, k))
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_pass_curves_average_over_tasks() -> None:
    tasks = [
        TaskScore("a", 2 / 3, (True, True, False)),
        TaskScore("b", 0.0, (False, False, False)),
        TaskScore("c", 1.0, (True, None, True)),  # an unscored epoch: this task has two samples
    ]
    curves = pass_curves(tasks, 3)
    assert curves["pass_at_k"]["1"] == pytest.approx((2 / 3 + 0 + 1) / 3)  # unrounded: rounded where shown
    assert curves["pass_at_k"]["2"] == pytest.approx((1 + 0 + 1) / 3)
    assert curves["pass_at_k"]["3"] == pytest.approx((1 + 0) / 2)  # c has only two scored epochs
    assert curves["pass_hat_k"]["2"] == pytest.approx((1 / 3 + 0 + 1) / 3)


def test_reducers() -> None:
    verdicts = [True, False, None, False]
    answers = ["42", "41", "x", "41"]
    assert reduce_epochs(verdicts, answers, Reducer.mean) == pytest.approx(1 / 3)
    assert reduce_epochs(verdicts, answers, Reducer.max) == 1.0
    assert reduce_epochs(verdicts, answers, Reducer.all) == 0.0
    assert reduce_epochs(verdicts, answers, Reducer.majority) == 0.0  # "41" twice
    assert reduce_epochs([True, False], ["a", "b"], Reducer.majority) == 1.0  # a tie: the first answer
    assert reduce_epochs([None, None], ["a", "b"], Reducer.mean) is None


def _mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar: the binomial test of min(b, c) among the b + c discordant pairs at p = 1/2."""
    n = b + c
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def test_paired_binary_comparison_uses_exact_mcnemar() -> None:
    # 20 tasks: 10 right in both, 3 right in A only (broken by B), 7 right in B only (fixed by B).
    a = {f"t{i}": 1.0 if i < 13 else 0.0 for i in range(20)}
    b = {f"t{i}": 0.0 if 10 <= i < 13 else 1.0 for i in range(20)}
    b["extra"] = 1.0  # scored in B only: not paired
    result = compare_paired(a, b)
    assert (result.n, result.fixed, result.broken, result.unchanged) == (20, 7, 3, 10)
    assert result.test == "mcnemar-exact"
    assert result.p_value == pytest.approx(_mcnemar_exact(3, 7))
    assert result.p_value == pytest.approx(0.34375)  # 2 * P(X <= 3), X ~ Bin(10, 1/2) = 2 * 176 / 1024
    d = [b[t] - a[t] for t in a]
    assert result.diff == pytest.approx(0.2)
    assert result.stderr == pytest.approx(statistics.stdev(d) / math.sqrt(20))
    assert not result.significant
    assert result.tasks_needed is not None and result.tasks_needed > 20
    assert "not distinguishable from noise" in result.verdict()


def test_a_clear_difference_gets_its_verdict() -> None:
    a = {f"t{i}": 0.0 for i in range(30)} | {f"t{i}": 1.0 for i in range(30, 60)}
    b = {f"t{i}": 1.0 for i in range(60)}
    result = compare_paired(a, b)
    assert result.p_value == pytest.approx(2 / 2**30)  # 30 fixed, none broken
    assert result.verdict("A", "B").startswith("B is ahead by 50.0 points, 95% CI [")
    assert result.tasks_needed is None


def test_fractional_scores_use_a_paired_t_test() -> None:
    from scipy import stats as sps

    a = {"a": 0.0, "b": 1 / 3, "c": 2 / 3, "d": 1.0, "e": 0.5}
    b = {"a": 1 / 3, "b": 1 / 3, "c": 1.0, "d": 1.0, "e": 1.0}
    result = compare_paired(a, b)
    d = [b[k] - a[k] for k in a]
    t = statistics.fmean(d) / (statistics.stdev(d) / math.sqrt(len(d)))
    assert result.test == "paired-t"
    assert result.p_value == pytest.approx(2 * sps.t.sf(abs(t), len(d) - 1))


def test_the_paired_interval_is_the_t_tests_and_a_decline_keeps_its_sign() -> None:
    from scipy import stats as sps

    # Nine tasks scored over three epochs: B is 11.1 points below A; a normal interval, [-22.0, -0.2], would
    # exclude 0 beside the t-test's p = 0.08.
    a = {f"t{i}": k / 3 for i, k in enumerate([3, 1, 1, 1, 2, 3, 2, 1, 2])}
    b = {f"t{i}": k / 3 for i, k in enumerate([3, 0, 1, 0, 1, 3, 2, 1, 2])}
    result = compare_paired(a, b)
    xa, xb = [a[t] for t in a], [b[t] for t in a]
    test = sps.ttest_rel(xb, xa)
    assert result.test == "paired-t" and result.p_value == pytest.approx(test.pvalue)
    se = statistics.stdev([v - u for u, v in zip(xa, xb, strict=True)]) / 3
    half = float(sps.t.ppf(0.975, 8)) * se
    assert (result.ci_low, result.ci_high) == pytest.approx((-1 / 9 - half, -1 / 9 + half))
    assert (result.ci_low, result.ci_high) == pytest.approx(tuple(test.confidence_interval(0.95)))
    assert result.ci_low is not None and result.ci_high is not None
    assert (result.ci_low < 0 < result.ci_high) == (result.p_value >= 0.05)
    verdict = result.verdict()
    assert verdict.startswith("not distinguishable from noise at this size (9 tasks): -11.1 points")
    assert "95% CI [-23.9, 1.7], p = 0.08" in verdict


def test_a_clustered_interval_uses_t_with_clusters_minus_one_degrees_of_freedom() -> None:
    from scipy import stats as sps

    values = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    groups = ["a", "a", "a", "b", "b", "c", "c", "c", "d", "d"]
    est = estimate(_tasks(values, groups), settings=StatsSettings(cluster_by="g"))
    assert est.stderr is not None and est.clusters == 4
    half = float(sps.t.ppf(0.975, 3)) * est.stderr
    assert (est.ci_low, est.ci_high) == pytest.approx((0.6 - half, min(1.0, 0.6 + half)))


def test_one_paired_task_is_not_known() -> None:
    result = compare_paired({"a": 1.0}, {"a": 0.0})
    assert result.n == 1 and result.p_value is None and result.ci_low is None
    assert result.verdict().startswith("not known")
    assert compare_paired({"a": 1.0}, {"b": 1.0}).n == 0


def test_sample_sizes_match_the_textbook_formula() -> None:
    # Two proportions 0.5 vs 0.6, 80% power, 5% two-sided: (1.96 + 0.8416)^2 (0.25 + 0.24) / 0.01 = 384.6.
    assert plan_power(0.5, 0.1).tasks == 385
    # Epochs shrink a task's variance by the within-task part only.
    plan = plan_power(0.5, 0.1, epochs=4, within_var=0.2)
    expected = (1.959964 + 0.841621) ** 2 * ((0.25 - 0.15) + (0.24 - 0.15)) / 0.01
    assert plan.tasks == math.ceil(expected)
    assert plan_power(0.5, 0.1, epochs=1, within_var=0.2).tasks == 385  # one epoch averages nothing away
    # A paired t-test: close to the normal approximation (z-sum squared / effect squared), a little above.
    need = tasks_for_power(0.1, 0.5)
    assert math.ceil((1.959964 + 0.841621) ** 2 / 0.2**2) <= need <= math.ceil((1.959964 + 0.841621) ** 2 / 0.04) + 3
    with pytest.raises(ValueError):
        plan_power(0.95, 0.1)


def test_holm_step_down() -> None:
    p = [0.01, 0.04, None, 0.03]
    # Sorted 0.01, 0.03, 0.04 (m = 3): 0.03, max(0.03, 0.06), max(0.06, 0.04) = 0.03, 0.06, 0.06.
    assert holm(p) == [pytest.approx(0.03), pytest.approx(0.06), None, pytest.approx(0.06)]


def test_every_task_moved_by_the_same_amount_gets_the_exact_sign_test() -> None:
    """Fractional scores (three epochs' means) each up by a third: no spread for a t-test, and not p = 0 either."""
    a = {"x": 0.0, "y": 1 / 3, "z": 1 / 3}
    b = {t: v + 1 / 3 for t, v in a.items()}
    result = compare_paired(a, b)
    assert result.test == "sign-exact" and result.p_value == pytest.approx(0.25)  # 2 x 0.5^3
    assert compare_paired(a, a).p_value == 1.0
