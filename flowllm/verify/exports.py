"""An export of a run against the run's checked outcomes: an Inspect AI log (read back with inspect_ai's own
reader) or a GAIA submission file. Given with ``flowllm verify RUN --export FILE`` (exports are written outside
the run folder, wherever the user chose).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flowllm.run.outcome import TaskOutcome
from flowllm.verify.evidence import NumberedLine, RunEvidence, VerifyInputError, read_jsonl
from flowllm.verify.findings import Audit

__all__ = ["check_export"]

INSPECT_SUFFIXES = (".eval", ".json")
SUBMISSION_SUFFIXES = (".jsonl",)
CORRECT, INCORRECT = "C", "I"  # inspect_ai's score values for a right and a wrong answer
TOKENS = ("input_tokens", "output_tokens")
LEDGERS = "the billed lines of usage.jsonl and judge_usage.jsonl"


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


def _billed(lines: Iterable[NumberedLine]) -> tuple[Counter[str], dict[str, Counter[str]], float | None]:
    """Recounted from the ledgers' lines: the billed tokens in all and per task, and the cost (None: unpriced)."""
    total: Counter[str] = Counter()
    per_task: dict[str, Counter[str]] = {}
    cost: float | None = 0.0
    for numbered in lines:
        line = numbered.ledger
        if line.type != "attempt" or not line.billed:
            continue
        counts = Counter({k: int((line.usage or {}).get(k) or 0) for k in TOKENS})
        total.update(counts)
        if line.task_id:
            per_task.setdefault(str(line.task_id), Counter()).update(counts)
        cost = None if cost is None or line.cost_usd is None else cost + float(line.cost_usd)
    return total, per_task, None if cost is None else round(cost, 6)


def _tokens(model_usage: Mapping[str, Any] | None) -> Counter[str]:
    """An Inspect model usage's tokens, every model's together."""
    return Counter({k: sum(int(getattr(u, k) or 0) for u in (model_usage or {}).values()) for k in TOKENS})


def _inspect_usage(log: Any, ev: RunEvidence, audit: Audit, name: str) -> None:
    """The log's model usage (each sample's, summed over its epochs, and the eval's) against the ledgers."""
    total, per_task, cost = _billed([*ev.ledger, *ev.judge_ledger])
    by_task: dict[str, Counter[str]] = {}
    for sample in log.samples or []:
        by_task.setdefault(str(sample.id), Counter()).update(_tokens(sample.model_usage))
    for task_id, tokens in sorted(by_task.items()):
        billed = per_task.get(task_id, Counter())
        field = f"sample {task_id}: model_usage tokens"
        audit.check(name, field, dict(tokens), {k: billed[k] for k in TOKENS}, LEDGERS)
    usage = log.stats.model_usage if log.stats is not None else {}
    audit.check(name, "stats.model_usage tokens", dict(_tokens(usage)), {k: total[k] for k in TOKENS}, LEDGERS)
    costs = [u.total_cost for u in usage.values()]
    # No model usage at all (a run that started no task): nothing was billed, $0.
    stated = None if any(c is None for c in costs) else round(sum(costs), 6)
    audit.check(name, "stats.model_usage total_cost", stated, cost, LEDGERS)


def _inspect(path: Path, outcomes: Mapping[str, TaskOutcome], ev: RunEvidence, audit: Audit) -> None:
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
    _inspect_usage(log, ev, audit, name)


def _submission(path: Path, outcomes: Mapping[str, TaskOutcome], audit: Audit) -> None:
    name = path.name
    for line in read_jsonl(path, path.parent):
        task_id = str(line.value.get("task_id"))
        outcome = outcomes.get(task_id)
        # Every task of the split has a line: one the run has no result for (not selected, or its budget never
        # started it) answers "" as a task without an answer does.
        expected = "" if outcome is None else (outcome.answer or "")
        field = f"line {line.number} ({task_id}): model_answer"
        audit.check(name, field, line.value.get("model_answer"), expected)


def check_export(path: Path, outcomes: Sequence[TaskOutcome], ev: RunEvidence, audit: Audit) -> None:
    """Compare one export file with the run's checked outcomes (an Inspect log's usage with the run's ledgers);
    its kind is told by its suffix."""
    if not path.is_file():
        raise VerifyInputError(f"--export {path}: no such file")
    by_id = {o.task_id: o for o in outcomes}
    if path.suffix in INSPECT_SUFFIXES:
        _inspect(path, by_id, ev, audit)
    elif path.suffix in SUBMISSION_SUFFIXES:
        _submission(path, by_id, audit)
    else:
        raise VerifyInputError(f"--export {path}: not an Inspect AI log (.eval, .json) or a GAIA submission (.jsonl)")
