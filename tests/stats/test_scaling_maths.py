"""majority@k (flowllm/analysis/scaling.py): counted without listing the k-subsets, equal to listing them.

``inspect scale`` averages each task's majority verdict over every k-subset of its epochs. Listed one by one that
took 3 s a task at 20 epochs and never ended at 32 (C(32, 16) = 6e8 subsets for one k); it is counted instead.
"""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowllm.analysis.epoch_runs import EpochOutcome, TaskEpochs
from flowllm.analysis.scaling import majority_at_k, majority_curve, majority_verdict

# A few answers, each epoch right or wrong on its own (a judge may rule one answer both ways).
EPOCH = st.builds(EpochOutcome, st.sampled_from(["a", "b", "c", "d"]), st.booleans())


def task(epochs: list[EpochOutcome]) -> TaskEpochs:
    return TaskEpochs("t", tuple(epochs), None, len(epochs))


def listed(epochs: list[EpochOutcome], k: int) -> float:
    """majority@k the slow way: every k-subset of the epochs, in epoch order, and its majority's verdict."""
    subsets = list(combinations(epochs, k))
    return sum(majority_verdict(s) for s in subsets) / len(subsets)


@given(st.lists(EPOCH, min_size=1, max_size=10))
def test_the_count_equals_the_listing_for_every_k(epochs: list[EpochOutcome]) -> None:
    curve = majority_curve(task(epochs))
    assert len(curve) == len(epochs)
    for k in range(1, len(epochs) + 1):
        assert abs(curve[k - 1] - listed(epochs, k)) < 1e-12
        assert majority_at_k(task(epochs), k) == curve[k - 1]


def test_ties_go_to_the_answer_seen_first() -> None:
    right, wrong = EpochOutcome("a", True), EpochOutcome("b", False)
    assert majority_curve(task([right, wrong])) == [0.5, 1.0]  # {a, b}: a came first
    assert majority_curve(task([wrong, right])) == [0.5, 0.0]


def test_sixty_four_epochs_are_counted() -> None:
    """64 epochs, k = 32: 1.8e18 subsets, which no listing finishes; the count is exact where it is known."""
    same = [EpochOutcome("a", True)] * 64
    assert majority_curve(task(same)) == pytest.approx([1.0] * 64)
    spread = [EpochOutcome(str(i % 8), i % 8 == 0) for i in range(64)]  # 8 answers, 8 epochs each, one right
    curve = majority_curve(task(spread))
    assert all(0.0 <= v <= 1.0 for v in curve)
    assert curve[0] == pytest.approx(1 / 8) and curve[-1] == pytest.approx(
        1.0
    )  # all 64: a tie of eight, which the first epoch's answer wins
