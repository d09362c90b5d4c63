"""How accuracy is counted, once, for the headline and for every breakdown (by level, by category).

A task's ``correct`` is True, False or None. None is unscored: the task has no ground truth (a test split), or
it is a replayed task that diverged from the saved run. Accuracy is over the scored tasks only, and None (not
known, never 0) when no task was scored; unfinished tasks of an interrupted run are not counted at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

ACCURACY_OF = "scored tasks: finished, with a ground truth (unscored and unfinished tasks are not counted)"


class Scored(Protocol):
    """What the tally reads of a task's outcome."""

    @property
    def correct(self) -> bool | None: ...


def score_tally(outcomes: Iterable[Scored]) -> dict[str, Any]:
    """``{tasks, scored, unscored, correct, accuracy}`` of some finished tasks."""
    tasks = scored = correct = 0
    for outcome in outcomes:
        tasks += 1
        if outcome.correct is not None:
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
    return f"{accuracy:.1%} ({correct}/{scored} scored)"
