"""An export of a run against the run's checked outcomes: an Inspect AI log (read back with inspect_ai's own
reader) or a GAIA submission file. Given with ``flowllm verify RUN --export FILE`` (exports are written outside
the run folder, wherever the user chose).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flowllm.run.outcome import TaskOutcome
from flowllm.verify.evidence import VerifyInputError, read_jsonl
from flowllm.verify.findings import Audit

__all__ = ["check_export"]

INSPECT_SUFFIXES = (".eval", ".json")
SUBMISSION_SUFFIXES = (".jsonl",)
CORRECT, INCORRECT = "C", "I"  # inspect_ai's score values for a right and a wrong answer


def _score_of(sample: Any) -> tuple[bool | None, Any]:
    """The verdict and the answer an Inspect sample's first score holds (None: the sample has no score)."""
    scores = sample.scores or {}
    if not scores:
        return None, None
    score = next(iter(scores.values()))
    value = score.value
    return (True if value == CORRECT else False if value == INCORRECT else None), score.answer


def _epoch_verdicts(outcome: TaskOutcome) -> dict[int, bool | None]:
    if outcome.epochs > 1:
        return {int(e.get("epoch") or n): e.get("correct") for n, e in enumerate(outcome.epoch_log, start=1)}
    return {1: outcome.correct}


def _inspect(path: Path, outcomes: Mapping[str, TaskOutcome], audit: Audit) -> None:
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        audit.skip(f"{path.name}: inspect_ai is not installed (pip install -e '.[inspect]')")
        return
    try:
        log = read_eval_log(str(path))
    except Exception as exc:  # inspect_ai raises many types for a file it cannot read
        raise VerifyInputError(f"{path} is not an Inspect AI log inspect_ai can read: {exc}") from exc
    name = path.name
    seen = set()
    for sample in log.samples or []:
        task_id, epoch = str(sample.id), int(sample.epoch or 1)
        seen.add(task_id)
        outcome = outcomes.get(task_id)
        if outcome is None:
            audit.check(name, f"sample {task_id}", "a sample", "no such task in the run")
            continue
        verdict, answer = _score_of(sample)
        audit.check(name, f"sample {task_id} epoch {epoch}: score", verdict, _epoch_verdicts(outcome).get(epoch))
        if outcome.epochs == 1 and verdict is not None:
            audit.check(name, f"sample {task_id}: score.answer", answer, outcome.answer)
    audit.check(name, "samples: tasks", sorted(seen), sorted(outcomes))


def _submission(path: Path, outcomes: Mapping[str, TaskOutcome], audit: Audit) -> None:
    name = path.name
    for line in read_jsonl(path, path.parent):
        task_id = str(line.value.get("task_id"))
        outcome = outcomes.get(task_id)
        expected = None if outcome is None else (outcome.answer or "")
        field = f"line {line.number} ({task_id}): model_answer"
        audit.check(name, field, line.value.get("model_answer"), expected)


def check_export(path: Path, outcomes: Sequence[TaskOutcome], audit: Audit) -> None:
    """Compare one export file with the run's checked outcomes; its kind is told by its suffix."""
    if not path.is_file():
        raise VerifyInputError(f"--export {path}: no such file")
    by_id = {o.task_id: o for o in outcomes}
    if path.suffix in INSPECT_SUFFIXES:
        _inspect(path, by_id, audit)
    elif path.suffix in SUBMISSION_SUFFIXES:
        _submission(path, by_id, audit)
    else:
        raise VerifyInputError(f"--export {path}: not an Inspect AI log (.eval, .json) or a GAIA submission (.jsonl)")
