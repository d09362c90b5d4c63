"""``inspect bisect``'s arithmetic (flowllm/analysis/attribution.py): a setting's effect, its interval and p value.

The forked tasks are strata chosen after the fact (the tasks whose score differs between A and B, all of them, and
a sample of the others), so the interval must carry the spread of the differences over all the common tasks, not
only within each stratum: the tasks that differ all flipped, most often the same way, and alone they would make
any effect look certain.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from flowllm.analysis.attribution import Change, Effect, Plan, changed_settings, effects, pick_tasks

CHANGE = Change("repair", ("repair=strict",), ("repair.name",))


def without_holm() -> contextlib.AbstractContextManager[object]:
    return mock.patch("flowllm.analysis.attribution.holm", lambda p_values: list(p_values))


def one_effect(
    a: dict[str, float], b: dict[str, float], forked: dict[str, float], sample: int, seed: int = 0
) -> tuple[Plan, Effect]:
    """The plan of two runs' scores and the one setting's effect, from the scores of its fork."""
    plan = pick_tasks(a, b, sample, seed)
    [effect] = effects(plan, [CHANGE], a, [{t: forked[t] for t in plan.tasks}])
    return plan, effect


def test_three_flips_of_ten_are_not_a_certainty() -> None:
    """Ten tasks, three broken by the change, five of the seven others forked and unchanged: -30 points with an
    interval about as wide as a plain paired test's over the ten, not [-30, -30] at p = 0."""
    ids = [f"t{i}" for i in range(10)]
    a = dict.fromkeys(ids, 1.0)
    b = {t: 0.0 if i < 3 else 1.0 for i, t in enumerate(ids)}
    plan, effect = one_effect(a, b, b, sample=5)
    assert len(plan.differing) == 3 and len(plan.sampled) == 5
    assert effect.effect == -0.3
    diffs = [b[t] - a[t] for t in ids]
    assert effect.stderr is not None  # every difference is known here: the plain paired standard error
    assert math.isclose(effect.stderr, statistics.stdev(diffs) / math.sqrt(10))
    assert effect.ci is not None and effect.ci[0] < -0.55 and effect.ci[1] > -0.05
    assert effect.p_value is not None and 0.04 < effect.p_value < 0.06
    assert (effect.flipped["broken"], effect.flipped["fixed"]) == (3, 0)


@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 1.0]), st.sampled_from([0.0, 1.0]), st.sampled_from([0.0, 1.0])),
        min_size=3,
        max_size=30,
    )
)
def test_forking_every_task_gives_the_plain_paired_standard_error(scores: list[tuple[float, float, float]]) -> None:
    ids = [f"t{i}" for i in range(len(scores))]
    a = {t: s[0] for t, s in zip(ids, scores, strict=True)}
    b = {t: s[1] for t, s in zip(ids, scores, strict=True)}
    forked = {t: s[2] for t, s in zip(ids, scores, strict=True)}
    with without_holm():  # one setting: Holm's adjustment is the identity (statsmodels' own call is slow)
        _, effect = one_effect(a, b, forked, sample=len(ids))  # the sample takes every other task
    diffs = [forked[t] - a[t] for t in ids]
    assert math.isclose(effect.effect, statistics.fmean(diffs), abs_tol=1e-12)
    assert effect.stderr is not None
    assert math.isclose(effect.stderr, statistics.stdev(diffs) / math.sqrt(len(ids)), abs_tol=1e-12)


def test_the_same_move_on_every_forked_task_gets_the_exact_sign_test() -> None:
    ids = [f"t{i}" for i in range(6)]
    a = dict.fromkeys(ids, 1.0)
    b = dict.fromkeys(ids, 0.0)
    _, effect = one_effect(a, b, b, sample=0)  # every task differs: all forked, all broken
    assert effect.effect == -1.0 and effect.stderr == 0.0
    assert effect.p_value == 2 * 0.5**6
    _, same = one_effect(a, b, a, sample=0)  # the change moved nothing
    assert same.effect == 0.0 and same.p_value == 1.0


def test_the_spread_of_a_sampled_stratum_of_one_task_is_not_known() -> None:
    ids = [f"t{i}" for i in range(8)]
    a = dict.fromkeys(ids, 1.0)
    b = {t: 0.0 if i < 3 else 1.0 for i, t in enumerate(ids)}
    plan, effect = one_effect(a, b, b, sample=1)  # one of the five others stands for them all
    assert len(plan.sampled) == 1
    assert effect.stderr is None and effect.ci is None and effect.p_value is None


def test_the_interval_covers_the_true_effect_as_often_as_it_says() -> None:
    """Many benchmarks of 40 tasks drawn from one population, where the change breaks 30% of the tasks A solves
    (a true effect of -18 points): the 95% interval (one setting) holds the true effect in about 95% of them."""
    rng = random.Random(7)
    runs, covered = 600, 0
    with without_holm():
        for run in range(runs):
            covered += covers(rng, run, truth=-0.18)
    assert covered / runs > 0.9


def covers(rng: random.Random, seed: int, truth: float) -> bool:
    """One benchmark of 40 tasks: does the interval of the change's effect hold ``truth``?"""
    ids = [f"t{i}" for i in range(40)]
    a = {t: float(rng.random() < 0.6) for t in ids}
    b = {t: 0.0 if a[t] and rng.random() < 0.3 else a[t] for t in ids}
    _, effect = one_effect(a, b, b, sample=10, seed=seed)
    assert effect.ci is not None
    return effect.ci[0] <= truth <= effect.ci[1]


def test_a_plan_keeps_every_differing_task() -> None:
    plan = pick_tasks({"x": 1.0, "y": 0.0, "z": 1.0}, {"x": 0.0, "y": 0.0, "z": 1.0}, sample=1, seed=3)
    assert plan == Plan(["x", "y", "z"], ["x"], plan.sampled) and len(plan.sampled) == 1


def test_a_switched_section_is_one_setting_with_its_keys() -> None:
    """B switches compaction on with its threshold: forked alone, ``agent.compaction.enabled=true`` is refused (no
    threshold) and the threshold alone acts on nothing in A (compaction off). The section is one setting; a key
    under a section both runs have on stays a setting of its own."""
    a = {"agent.compaction.enabled": False, "agent.compaction.keep_turns": 2, "agent.max_turns": 8}
    b = {
        "agent.compaction.enabled": True,
        "agent.compaction.keep_turns": 1,
        "agent.compaction.threshold_tokens": 300,
        "agent.max_turns": 4,
        "memory.enabled": True,
        "memory.top_k": 3,
    }
    a |= {"memory.enabled": True, "memory.top_k": 5}
    changes, left_out = changed_settings(a, b, ({}, {}), {}, dataset_files_differ=False)
    assert left_out == []
    assert {c.name: c.overrides for c in changes} == {
        "agent.compaction": (
            "agent.compaction.enabled=true",
            "agent.compaction.keep_turns=1",
            "agent.compaction.threshold_tokens=300",
        ),
        "agent.max_turns": ("agent.max_turns=4",),
        "memory.top_k": ("memory.top_k=3",),
    }
    switched = next(c for c in changes if c.name == "agent.compaction")
    assert switched.keys == (
        "agent.compaction.enabled",
        "agent.compaction.keep_turns",
        "agent.compaction.threshold_tokens",
    )
