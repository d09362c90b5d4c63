"""Which tasks are scored, and how accuracy is counted: once, for the headline, every breakdown (by level, by
category), the statistics, pass@k and the paired comparisons.

A task's ``correct`` is True, False or None. None is unscored: the task has no ground truth (a test split), its
answer could not be scored (the judge failed: ``score_error``), or it is a replayed task whose saved replies
answered another conversation (a replay verdict other than exact or forked). A task the run's budget stopped
(status ``budget``) is unfinished: counted in neither scored nor unscored, like a task an interruption never
ran. Accuracy is over the scored tasks only, and None (not known, never 0) when no task was scored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol, TypeVar

ACCURACY_OF = "scored tasks: finished, with a ground truth (unscored and unfinished tasks are not counted)"

# The status of a task the run's budget stopped (experiment.budget): unfinished, a rerun runs it again.
UNFINISHED_STATUS: Final = "budget"
# The replay verdicts (flowllm/run/replay_audit.py) whose result is the new pipeline's own: every model
# reply answered the request it was given (exact), or the task went live where it parted (forked).
SCORED_REPLAYS: Final = frozenset({"exact", "forked"})


class Scored(Protocol):
    """What the tally reads of a task's outcome."""

    @property
    def status(self) -> str: ...

    @property
    def correct(self) -> bool | None: ...


S = TypeVar("S", bound=Scored)


def is_finished(status: str | None) -> bool:
    """Whether a task with this status is counted at all (a budget-stopped task is not)."""
    return status != UNFINISHED_STATUS


def replay_scored(verdict: Mapping[str, Any] | None) -> bool:
    """Whether a task with this replay verdict (None: not a replay) can have a score."""
    return verdict is None or verdict.get("status") in SCORED_REPLAYS


def finished(outcomes: Iterable[S]) -> list[S]:
    """The outcomes that are counted: every one but those the run's budget stopped."""
    return [o for o in outcomes if is_finished(o.status)]


def known_score(
    *,
    status: str | None,
    replay: Mapping[str, Any] | None,
    correct: bool | None,
    score_error: str | None = None,
    epochs: int = 1,
    score: float | None = None,
) -> float | None:
    """A task's score in [0, 1] (its epochs reduced, or its verdict), or None when it is not scored: unfinished,
    a replay that did not replay (exact or forked), no ground truth, or a scoring error."""
    if not is_finished(status) or not replay_scored(replay):
        return None
    if epochs > 1:
        return float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None
    if correct is None or score_error:
        return None
    return float(bool(correct))


def judging_failed(outcome: Any) -> bool:
    """A task left unscored because its answer could not be scored (the judge failed): not known, even where a
    run written before such tasks were recorded unscored says ``correct: false``. A task over epochs only when
    none of its epochs was scored and one of them failed so (its ``score_error`` is its last epoch's: it is
    scored on the others)."""
    if int(getattr(outcome, "epochs", 1) or 1) > 1:
        log = getattr(outcome, "epoch_log", None) or []
        return getattr(outcome, "score", None) is None and any(e.get("score_error") for e in log)
    return bool(getattr(outcome, "score_error", None))


def score_tally(outcomes: Iterable[Scored]) -> dict[str, Any]:
    """``{tasks, scored, unscored, correct, accuracy}`` of the finished tasks among ``outcomes``."""
    tasks = scored = correct = 0
    for outcome in finished(outcomes):
        tasks += 1
        if outcome.correct is not None and not judging_failed(outcome):
            scored += 1
            correct += int(outcome.correct)
    return {
        "tasks": tasks,
        "scored": scored,
        "unscored": tasks - scored,
        "correct": correct,
        "accuracy": round(correct / scored, 4) if scored else None,
    }


def accuracy_text(correct: int | None, scored: int | None, accuracy: float | None) -> str:
    """``80.0% (8/10 scored)``, or ``not known (0 scored)`` when nothing could be scored."""
    if accuracy is None or not scored:
        return f"not known ({scored or 0} scored)"
    shown = accuracy if correct is None else correct / scored  # from the counts: the stored figure is rounded
    return f"{shown:.1%} ({correct}/{scored} scored)"
