"""summary.json → stats from a run's outcomes: unscored tasks (correct null, a scoring error, a replay that
did not replay exactly) are left out of n; breakdowns by level and dataset field; clusters; epochs."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flowllm.config.schema import IntervalMethod, Reducer
from flowllm.core.types import Usage
from flowllm.datasets.task import Task
from flowllm.errors import ConfigError
from flowllm.run.outcome import COMPLETED, TaskOutcome
from flowllm.run.stats import check_stats, run_stats, score_map, stats_rows
from flowllm.scoring.stats import StatsSettings
from flowllm.scoring.tally import accuracy_text, score_tally


def _task(i: int, topic: str, level: int = 1) -> Task:
    return Task(f"t{i}", "q", level, "42", None, Path("."), {"topic": topic})


def _outcome(i: int, correct: Any, level: int = 1, **extra: Any) -> TaskOutcome:
    outcome = TaskOutcome(f"t{i}", COMPLETED, "42", "42", correct, 1, Usage(), level=level)
    for key, value in extra.items():
        setattr(outcome, key, value)
    return outcome


def test_unscored_tasks_are_left_out_of_n() -> None:
    tasks = [_task(i, "a" if i < 4 else "b", level=1 + i % 2) for i in range(8)]
    outcomes = [_outcome(i, i % 3 == 0, level=1 + i % 2) for i in range(5)]
    outcomes.append(_outcome(5, None, level=2))  # no ground truth: not scored
    outcomes.append(_outcome(6, False, score_error="the judge failed"))
    outcomes.append(_outcome(7, True, level=2, replay={"status": "diverged"}))
    stats = run_stats(outcomes, tasks, epochs=1, reducer=Reducer.mean, settings=StatsSettings(), breakdown=["topic"])
    assert (stats["scored"], stats["unscored"]) == (5, 3)
    acc = stats["accuracy"]
    assert acc["n"] == 5 and acc["mean"] == pytest.approx(2 / 5)
    assert set(stats["by_level"]) == {"1", "2"} and stats["by_level"]["2"]["n"] == 2
    assert stats["by_field"]["topic"]["a"]["n"] == 4 and stats["by_field"]["topic"]["b"]["n"] == 1
    assert stats["by_field"]["topic"]["b"]["ci95"] is None  # one task: not known
    assert "pass_at_k" not in stats


def test_the_headline_tally_and_the_statistics_leave_out_the_same_tasks() -> None:
    """A scoring error is unscored in the tally as in the statistics, also where a run made before such tasks were
    recorded unscored says ``correct: false``; a task over epochs is scored on its judged epochs."""
    tasks = [_task(i, "a") for i in range(5)]
    outcomes = [_outcome(0, True), _outcome(1, False), _outcome(2, None, score_error="the judge failed")]
    outcomes.append(_outcome(3, False, score_error="the judge failed"))  # as such a task was once recorded
    log = [{"status": COMPLETED, "correct": True}, {"status": COMPLETED, "correct": None, "score_error": "x"}]
    outcomes.append(_outcome(4, True, epochs=2, epoch_log=log, score=1.0, score_error="x"))
    tally = score_tally(outcomes)
    stats = run_stats(outcomes, tasks, epochs=2, reducer=Reducer.mean, settings=StatsSettings())
    assert (tally["scored"], tally["unscored"], tally["correct"]) == (3, 2, 2)
    assert (stats["scored"], stats["unscored"]) == (tally["scored"], tally["unscored"])
    assert stats["accuracy"]["mean"] == pytest.approx(tally["correct"] / tally["scored"])


def test_clustered_by_a_dataset_field() -> None:
    topics = ["a", "a", "b", "b", "b", "c"]
    tasks = [_task(i, t) for i, t in enumerate(topics)]
    values = [True, True, False, True, False, False]
    outcomes = [_outcome(i, v) for i, v in enumerate(values)]
    settings = StatsSettings(interval=IntervalMethod.wilson, cluster_by="topic")
    acc = run_stats(outcomes, tasks, epochs=1, reducer=Reducer.mean, settings=settings)["accuracy"]
    assert acc["stderr_method"] == "clustered" and acc["clusters"] == 3 and acc["interval"] == "clt"
    x = [float(v) for v in values]
    mean = statistics.fmean(x)
    sums = [sum(v - mean for v, t in zip(x, topics, strict=True) if t == g) for g in "abc"]
    assert acc["stderr"] == pytest.approx(math.sqrt(1.5 * sum(s * s for s in sums) / 36), abs=1e-6)


def test_epochs_reduce_and_pass_at_k() -> None:
    tasks = [_task(i, "a") for i in range(3)]
    logs = [
        [{"correct": True}, {"correct": False}, {"correct": True}],
        [{"correct": False}, {"correct": False}, {"correct": False}],
        [{"correct": True}, {"correct": None}, {"correct": True}],
    ]
    outcomes = []
    for i, log in enumerate(logs):
        scored = [e["correct"] for e in log if e["correct"] is not None]
        outcomes.append(_outcome(i, True, epochs=3, epoch_log=log, score=sum(scored) / len(scored)))
    stats = run_stats(outcomes, tasks, epochs=3, reducer=Reducer.mean, settings=StatsSettings())
    assert stats["accuracy"]["mean"] == pytest.approx((2 / 3 + 0 + 1) / 3, abs=1e-6)
    assert stats["accuracy"]["interval"] == "clt"  # fractional scores
    # Within-task variance: task 0's verdicts 1,0,1 have variance 1/3; task 1's 0; task 2's (two epochs) 0.
    assert stats["accuracy"]["within_task_var"] == pytest.approx((1 / 3) / 3, abs=1e-6)
    assert stats["pass_at_k"]["3"] == pytest.approx(0.5)  # task 2 has two scored epochs: left out at k=3


def test_an_epoch_or_task_the_budget_stopped_is_neither_scored_nor_unscored() -> None:
    tasks = [_task(i, "a") for i in range(3)]
    stopped = {"status": "budget", "correct": False}
    logs = [
        [{"status": "completed", "correct": True}, stopped],
        [{"status": "completed", "correct": False}, {"status": "completed", "correct": True}],
    ]
    outcomes = [_outcome(i, True, epochs=2, epoch_log=log, score=None) for i, log in enumerate(logs)]
    outcomes[0].score, outcomes[1].score = 1.0, 0.5
    outcomes.append(_outcome(2, False, status="budget", epochs=2, epoch_log=[stopped, stopped], score=0.0))
    stats = run_stats(outcomes, tasks, epochs=2, reducer=Reducer.mean, settings=StatsSettings())
    assert (stats["scored"], stats["unscored"]) == (2, 0)
    assert stats["pass_at_k"]["1"] == pytest.approx((1.0 + 0.5) / 2)  # task 0 has one scored epoch
    assert stats["pass_at_k"]["2"] == pytest.approx(1.0)  # only task 1 has two
    results = [o.to_dict() for o in outcomes]
    assert set(score_map(results)) == {"t0", "t1"}


def test_pass_at_1_and_the_mean_are_one_figure_rounded_once() -> None:
    """14 of 27 epochs right (51.85%): pass@1 and the mean are the same number and must print the same."""
    tasks = [_task(i, "a") for i in range(9)]
    rights = [3, 3, 2, 2, 1, 1, 1, 1, 0]  # 14 of 27
    outcomes = []
    for i, right in enumerate(rights):
        log = [{"status": COMPLETED, "correct": e < right} for e in range(3)]
        outcomes.append(_outcome(i, right >= 2, epochs=3, epoch_log=log, score=right / 3))
    stats = run_stats(outcomes, tasks, epochs=3, reducer=Reducer.mean, settings=StatsSettings())
    rows = dict(stats_rows({"stats": stats}))
    assert rows["accuracy ± SE [95% CI]"].startswith("51.9% ± ")
    assert rows["pass@k"].startswith("k=1: 51.9%, ")
    assert (
        accuracy_text(
            14, 27, score_tally([SimpleNamespace(status=COMPLETED, correct=i < 14) for i in range(27)])["accuracy"]
        )
        == "51.9% (14/27 scored)"
    )


def test_score_map_reads_result_files() -> None:
    results = [
        {"task_id": "a", "correct": True},
        {"task_id": "b", "correct": None},
        {"task_id": "c", "correct": False, "score_error": "x"},
        {"task_id": "d", "correct": True, "epochs": 3, "score": 2 / 3},
        {"task_id": "e", "correct": False, "epochs": 3, "score": None},
        {"task_id": "f", "correct": True, "replay": {"status": "diverged"}},
        {"task_id": "g", "correct": True, "replay": {"status": "exact"}},
    ]
    assert score_map(results) == {"a": 1.0, "d": pytest.approx(2 / 3), "g": 1.0}


def test_a_cluster_field_the_dataset_lacks_is_refused() -> None:
    tasks = [_task(0, "a")]
    cfg = SimpleNamespace(interval="wilson", cluster_by="category", resamples=2000, seed=0)
    with pytest.raises(ConfigError, match=r"stats\.cluster_by: the dataset has no field 'category'"):
        check_stats(cfg, tasks)
    check_stats(SimpleNamespace(interval="clt", cluster_by="topic", resamples=2000, seed=0), tasks)
    check_stats(SimpleNamespace(interval="clt", cluster_by="level", resamples=2000, seed=0), tasks)


def test_epoch_summary_line() -> None:
    from flowllm.run.epochs import epoch_summary

    result = {
        "epochs": 3,
        "epoch_reducer": "majority",
        "score": 0.0,
        "epoch_log": [
            {"epoch": 1, "correct": True, "answer": "42"},
            {"epoch": 2, "correct": False, "answer": "41"},
            {"epoch": 3, "correct": False, "answer": None, "score_error": "the judge failed"},
        ],
    }
    assert epoch_summary(result) == "3, majority 0.0%: 1 yes (42), 2 no (41), 3 not scored"
    assert epoch_summary({"epochs": 1}) is None


def test_scoring_errors_count_the_tasks_a_failed_judge_left_unscored() -> None:
    """Over epochs, a task's ``score_error`` is its last epoch's: the task is still scored on its other epochs,
    and it is no scoring error. Counted as one, the headline called a task without a ground truth "could not be
    scored"."""
    from flowllm.run.report import headline_accuracy
    from flowllm.scoring.report import scoring_summary

    judged = [{"status": COMPLETED, "correct": True}, {"status": COMPLETED, "correct": None, "score_error": "x"}]
    failed = [{"status": COMPLETED, "correct": None, "score_error": "x"}] * 2
    outcomes = [
        _outcome(0, True, epochs=2, epoch_log=judged, score=1.0, score_error="x"),  # scored on its first epoch
        _outcome(1, None, epochs=2, epoch_log=failed, score=None, score_error="x"),  # no epoch could be scored
        _outcome(2, None),  # no ground truth
    ]
    summary = scoring_summary(outcomes, scorer="judge")
    assert summary["scoring_errors"] == 1 and summary["accuracy_scored"] == 1.0
    tally = score_tally(outcomes)
    assert (tally["scored"], tally["unscored"]) == (1, 2)
    line = headline_accuracy({**tally, "scoring_errors": summary["scoring_errors"]})
    assert line == (
        "100.0% (1/1 scored); 1 unscored: the answer could not be scored (a rerun into this folder scores it "
        "again); 1 unscored: no ground truth"
    )
