"""Epochs (``experiment.epochs`` > 1): a task run N independent times, each epoch in its own folder
(``tasks/<id>/epochs/<n>/``, flowllm/rundir/layout.py), reduced to one score per task.

Each epoch is a whole run of the task (with its own ``experiment.attempts`` retries) and writes its own
``result.json``; a rerun into the same folder keeps the completed epochs and runs only the missing or failed
ones. The task's ``result.json`` is written when every epoch has one: it carries each epoch's entry
(``epoch_log``), the reduced ``score`` (``experiment.epoch_reducer``) and ``correct`` (the score is at least 0.5:
a majority of epochs, or the reducer's own yes/no), with the tokens and time of all epochs summed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flowllm.config.schema import Reducer
from flowllm.rundir.results import TaskResult
from flowllm.scoring.scorers import normalize_answer
from flowllm.scoring.stats import reduce_epochs
from flowllm.scoring.tally import is_finished

__all__ = ["epoch_score", "epoch_summary", "epoch_verdict", "epoch_verdicts", "reduce_entries"]


def epoch_verdict(entry: Mapping[str, Any]) -> bool | None:
    """An epoch's verdict: True, False, or None when the epoch was not scored (no ground truth, a diverged
    replay, an answer the judge could not score, an epoch the run's budget stopped)."""
    value = entry.get("correct")
    if value is None or entry.get("score_error") or not is_finished(entry.get("status")):
        return None
    return bool(value)


def epoch_verdicts(entries: Sequence[Mapping[str, Any]]) -> list[bool | None]:
    """Each epoch's verdict (``epoch_verdict``)."""
    return [epoch_verdict(entry) for entry in entries]


def reduce_entries(entries: Sequence[Mapping[str, Any]], reducer: Reducer) -> float | None:
    """The task's score from its epochs' entries (None: no epoch was scored)."""
    answers = [normalize_answer(str(e.get("answer") or "")) for e in entries]
    return reduce_epochs(epoch_verdicts(entries), answers, reducer)


def epoch_score(score: float | None) -> bool | None:
    """``correct`` of a task scored over epochs: its score is at least one half (None: not scored)."""
    return None if score is None else score >= 0.5


def epoch_summary(result: TaskResult | Mapping[str, Any]) -> str | None:
    """One line about a ``result.json``'s epochs (None without epochs): ``3, mean 66.7%: 1 yes (42), 2 no
    (41), 3 yes (42)``; each epoch's turns are under ``epochs/<n>/`` of the task."""
    result = TaskResult.coerce(result)
    log = result.epoch_log
    if int(result.epochs or 1) <= 1 or not isinstance(log, list):
        return None
    score = result.score
    shown = "not scored" if not isinstance(score, (int, float)) else f"{100 * float(score):.1f}%"
    verdicts = epoch_verdicts(log)
    parts = []
    for entry, verdict in zip(log, verdicts, strict=True):
        word = "not scored" if verdict is None else "yes" if verdict else "no"
        answer = entry.get("answer")
        parts.append(f"{entry.get('epoch')} {word}" + (f" ({answer})" if answer is not None else ""))
    return f"{result.epochs}, {result.epoch_reducer or 'mean'} {shown}: " + ", ".join(parts)
