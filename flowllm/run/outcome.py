"""A task's outcome: what ``tasks/<id>/result.json`` holds, its statuses, and how a saved one is read back.

A saved outcome is read as valid or not at all (``outcome_problems``): an invalid one makes the task run again.
Its score is never taken from the file: with the task and the scorer's rules, ``correct`` is recomputed from
the recorded answer and the dataset (``read_outcome``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowllm.config.schema import Reducer
from flowllm.core.types import Usage
from flowllm.datasets.task import Task
from flowllm.engine.recorder import read_json
from flowllm.run.epochs import epoch_score, reduce_entries
from flowllm.run.replay_audit import is_scored
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import TaskResult, result_problems
from flowllm.scoring import Score
from flowllm.scoring.scorers import RuleScore
from flowllm.scoring.tally import known_score
from flowllm.spend.spending import STATUS_BUDGET, STATUS_LIMIT

log = logging.getLogger(__name__)

COMPLETED = "completed"
FAILED = "failed"
LIMIT = STATUS_LIMIT  # a per-task limit ended it (agent.limits): finished, scored on the answer it gave
BUDGET = STATUS_BUDGET  # the run's budget ended it (experiment.budget): unfinished, a rerun runs it again
STATUSES = (COMPLETED, FAILED, LIMIT, BUDGET)
FINISHED = (COMPLETED, LIMIT)  # a rerun into the same folder keeps these


@dataclass
class TaskOutcome:
    task_id: str
    status: str
    answer: str | None
    ground_truth: str | None
    # True or False when scored; None when the task cannot be scored (no ground truth; a replayed task that
    # diverged). Accuracy counts scored tasks only.
    correct: bool | None
    turns: int
    usage: Usage
    error: str | None = None
    level: int | None = None
    stop: str | None = None
    tool_calls: int = 0
    bad_tool_calls: int = 0
    failed_tool_calls: int = 0
    infra_tool_failure_causes: dict[str, int] = field(default_factory=dict)  # cause -> calls (not the model's)
    repairs: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    # pass@k: how many attempts ran, and what each one gave (usage above is the sum over all of them).
    attempts: int = 1
    attempt_log: list[dict[str, Any]] = field(default_factory=list)
    # Under provider=replay: whether the task replayed exactly (replay_audit.py); absent otherwise.
    replay: dict[str, Any] | None = None
    # experiment.epochs > 1: how many ran, each one's entry, and the task's score reduced over them
    # (flowllm/run/epochs.py); one epoch: the score is the verdict.
    epochs: int = 1
    epoch_log: list[dict[str, Any]] = field(default_factory=list)
    epoch_reducer: str | None = None
    score: float | None = None
    # Scoring (flowllm/scoring): an answer that could not be judged, the judge's verdict and who gave it, and
    # the task's values of the dataset's breakdown fields (topic, category...).
    score_error: str | None = None
    verdict: str | None = None
    judge: dict[str, Any] | None = None
    categories: dict[str, Any] = field(default_factory=dict)
    limit: str | None = None  # status limit: which one (agent.limits.<name>); status budget: null
    halt_detail: str | None = None  # what reached the limit or the budget, one line
    scored: bool = True  # false: a limited task's answer was not scored (agent.limits.score_partial=false)
    # A rerun resumed the task inside (flowllm/run/resume.py): the calls its saved turns answered, and the first
    # resumed node whose output differed from the saved one.
    resumed_turns: int = 0
    resume_divergence: dict[str, Any] | None = None
    _attempt_timings: list[dict[str, Any]] = field(default_factory=list, repr=False)
    # Seconds this attempt's own tool servers spent starting (inside its wall time, apart from the calls).
    _tools_start_s: float = field(default=0.0, repr=False)

    def to_result(self) -> TaskResult:
        """``result.json`` as a record: the keys of a limit or budget stop, epochs and a replay only when they apply."""
        return TaskResult(
            task_id=self.task_id,
            status=self.status,
            answer=self.answer,
            ground_truth=self.ground_truth,
            correct=self.correct,
            turns=self.turns,
            usage=self.usage.to_dict(),
            error=self.error,
            level=self.level,
            stop=self.stop,
            tool_calls=self.tool_calls,
            bad_tool_calls=self.bad_tool_calls,
            failed_tool_calls=self.failed_tool_calls,
            infra_tool_failures=sum(self.infra_tool_failure_causes.values()),
            infra_tool_failure_causes=dict(sorted(self.infra_tool_failure_causes.items())),
            repairs=dict(sorted(self.repairs.items())),
            attempts=self.attempts,
            attempt_log=self.attempt_log,
            replay=self.replay,
            epochs=self.epochs,
            epoch_reducer=self.epoch_reducer,
            epoch_log=self.epoch_log,
            score=self.score,
            limit=self.limit,
            halt_detail=self.halt_detail,
            scored=self.scored,
            score_error=self.score_error,
            verdict=self.verdict,
            judge=self.judge,
            categories=self.categories,
            resumed_turns=self.resumed_turns,
            resume_divergence=self.resume_divergence,
        )

    def to_dict(self) -> dict[str, Any]:
        return self.to_result().to_dict()

    def resumed_from(self, served: int, divergence: dict[str, Any] | None) -> TaskOutcome:
        """This attempt resumed from its saved turns: ``served`` calls answered by them (flowllm/run/resume.py)."""
        self.resumed_turns, self.resume_divergence = served, divergence
        return self

    @property
    def retry_settled(self) -> bool:
        """Whether pass@k's retry-until-correct ends at this attempt: a correct answer, the run's budget, or an
        answer another attempt cannot prove wrong: no ground truth to retry until, or one the scorer gave no
        verdict on (another attempt would pay the agent again and drop an answer that may be right; a resume
        judges it again). An attempt that gave no answer (failed) is retried either way."""
        if self.correct or self.status == BUDGET:
            return True
        answered = self.status != FAILED and self.correct is None
        return answered and (self.ground_truth is None or self.score_error is not None)

    def apply_score(self, score: Score) -> None:
        self.correct = score.correct
        self.score_error = score.error
        self.verdict = score.verdict
        self.judge = dict(score.details) if score.details else None

    def timing_dict(self) -> dict[str, Any]:
        """``timing.json``: what changes from one identical run to the next, kept out of ``result.json``."""
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "attempts": [round(float(e.get("wall_seconds", 0.0)), 3) for e in self._attempt_timings],
            # Tool-server start-up, its own step: how much of each attempt's wall time went to starting servers.
            "tools_start_s": [round(float(e.get("tools_start_s", 0.0)), 3) for e in self._attempt_timings],
        }

    @classmethod
    def from_result(cls, result: TaskResult) -> TaskOutcome:
        """The outcome a ``result.json`` records (its timings are in ``timing.json``, not here)."""
        return cls(
            task_id=result.task_id,
            status=result.status,
            answer=result.answer,
            ground_truth=result.ground_truth,
            correct=result.correct,
            turns=result.turns,
            usage=Usage.from_dict(result.usage),
            error=result.error,
            level=result.level,
            stop=result.stop,
            tool_calls=result.tool_calls,
            bad_tool_calls=result.bad_tool_calls,
            failed_tool_calls=result.failed_tool_calls,
            infra_tool_failure_causes=dict(result.infra_tool_failure_causes),
            repairs=dict(result.repairs),
            attempts=result.attempts,
            attempt_log=result.attempt_log,
            replay=result.replay,
            epochs=result.epochs,
            epoch_log=result.epoch_log,
            epoch_reducer=result.epoch_reducer,
            score=result.score,
            score_error=result.score_error,
            verdict=result.verdict,
            judge=result.judge,
            categories=result.categories,
            limit=result.limit,
            halt_detail=result.halt_detail,
            scored=result.scored,
            wall_seconds=float(result.wall_seconds or 0.0),
            resumed_turns=result.resumed_turns,
            resume_divergence=result.resume_divergence,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskOutcome:
        return cls.from_result(TaskResult.from_dict(data))

    @property
    def scored_again(self) -> bool:
        """Whether a resume must score this finished task again: its answer could not be scored (the judge failed),
        or, over epochs, one of its epochs' could not (that epoch runs again)."""
        if self.epochs > 1:
            return any(entry.get("score_error") for entry in self.epoch_log)
        return bool(self.score_error)

    @property
    def task_score(self) -> float | None:
        """The task's score in [0, 1]: reduced over its epochs, or its verdict; None when not scored (tally.py)."""
        return known_score(
            status=self.status,
            replay=self.replay,
            correct=self.correct,
            score_error=self.score_error,
            epochs=self.epochs,
            score=self.score,
        )

    def epoch_entry(self, number: int) -> dict[str, Any]:
        return {**self.attempt_entry(self.attempts), "epoch": number, "attempts": self.attempts}

    def attempt_entry(self, number: int) -> dict[str, Any]:
        return {
            "attempt": number,
            "status": self.status,
            "answer": self.answer,
            "correct": self.correct,
            "score_error": self.score_error,
            "turns": self.turns,
            "stop": self.stop,
            "error": self.error,
            "usage": self.usage.to_dict(),
            "scored": self.scored,
        }


def unscored_or(task: Task, correct: bool | None) -> bool | None:
    """``correct`` for a task that has ground truth; None (unscored) for one that has none."""
    return None if task.ground_truth is None else correct


def read_outcome(path: Path, task: Task | None = None, rescore: RuleScore | None = None) -> TaskOutcome | None:
    """A task's saved outcome, or None when there is none or it is not a valid result (then the task reruns).

    With ``task``, the file must be that task's, and the score is not taken from it: ``correct`` and
    ``ground_truth`` are recomputed from the recorded answer and the dataset, so a ``result.json`` edited by
    hand or forged by tool code cannot change the accuracy.
    """
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except Exception as exc:
        log.warning("%s cannot be read (%s); the task runs again", path, exc)
        return None
    problems = outcome_problems(data)
    result = TaskResult.from_dict(data) if not problems else None
    if result is not None and task is not None and result.task_id != task.task_id:
        problems = [f"task_id is {result.task_id!r}, not {task.task_id!r}"]
    if result is None or problems:
        log.warning("%s is not a valid result (%s); the task runs again", path, "; ".join(problems[:3]))
        return None
    outcome = TaskOutcome.from_result(result)
    if task is not None and rescore is not None and outcome.epochs > 1:
        _rescore_epochs(outcome, task, rescore)
    elif task is not None and rescore is not None:
        # Scored by rules: recomputed here. A judged score comes from the judge's own saved verdict instead.
        # A failed task is wrong when there is a ground truth to be wrong against, unscored otherwise; so is a
        # task a limit ended when it is not scored on its partial answer (agent.limits.score_partial=false).
        finished = outcome.status in FINISHED and outcome.scored
        rescored = rescore(task, outcome.answer) if finished else unscored_or(task, False)
        if rescored != outcome.correct or outcome.ground_truth != task.ground_truth:
            log.warning(
                "%s says correct=%s; scored against the dataset it is %s (the dataset's score is used)",
                path,
                outcome.correct,
                rescored,
            )
        outcome.correct = (None if rescored is None else bool(rescored)) if is_scored(outcome.replay) else None
        outcome.ground_truth = task.ground_truth
    return outcome


def _rescore_epochs(outcome: TaskOutcome, task: Task, rescore: RuleScore) -> None:
    """An epochs result: each epoch's verdict is recomputed from its answer, and the task's score from them."""
    for entry in outcome.epoch_log:
        verdict = _epoch_verdict(entry, task, rescore)
        entry["correct"] = None if verdict is None else bool(verdict)
    reducer = Reducer(outcome.epoch_reducer or Reducer.mean)
    outcome.score = reduce_entries(outcome.epoch_log, reducer) if is_scored(outcome.replay) else None
    outcome.correct = epoch_score(outcome.score)
    outcome.ground_truth = task.ground_truth


def _epoch_verdict(entry: dict[str, Any], task: Task, rescore: RuleScore) -> bool | None:
    """One epoch's verdict from its entry: a finished epoch scored on its answer (a limit's only when it scored
    partial answers), an unfinished one (the budget stopped it) or one that had none when it ran (a replay that
    did not replay) none, a failed one wrong where there is a ground truth."""
    status = entry.get("status")
    if status == COMPLETED or (status == LIMIT and entry.get("scored", True)):
        return rescore(task, entry.get("answer"))
    if status == BUDGET or entry.get("correct") is None:
        return None
    return unscored_or(task, False)


def outcome_problems(data: Any) -> list[str]:
    """What makes ``data`` not a ``result.json`` this version wrote (empty: it is one): its keys' types
    (flowllm/rundir/results.py), then its status and counts."""
    problems = result_problems(data)
    if problems:
        return problems
    result = TaskResult.from_dict(data)
    if result.status not in STATUSES:
        problems.append(f"status is {result.status!r}, not one of {', '.join(STATUSES)}")
    if result.turns < 0 or result.tool_calls < 0:
        problems.append("a count is negative")
    counts = [v for k, v in result.usage.items() if k.endswith("_tokens")]
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in counts):
        problems.append("usage holds a token count that is not a whole number")
    if any(not isinstance(v, int) or isinstance(v, bool) for v in result.repairs.values()):
        problems.append("repairs holds a count that is not a whole number")
    return problems


def stopped_by_budget(path: Path, task: Task, rescore: RuleScore | None) -> TaskOutcome | None:
    """The task's saved result when an earlier session's budget stopped it (unfinished, its turns and tokens
    spent): still the folder's record of the task while a rerun does not start it again."""
    outcome = read_outcome(path, task, rescore)
    return outcome if outcome is not None and outcome.status == BUDGET else None


def load_outcomes(run_dir: Path, tasks: Iterable[Task], rescore: RuleScore | None = None) -> list[TaskOutcome]:
    """The outcomes on disk for ``tasks`` (dataset order): how a summary is rebuilt after an interruption.
    ``rescore``: the scorer's rules, so ``correct`` is recomputed from the answer, never read from the file."""
    layout = RunLayout(Path(run_dir))
    found = []
    for task in tasks:
        outcome = read_outcome(layout.result(task.task_id), task, rescore)
        if outcome is not None:
            found.append(outcome)
    return found


def describe_error(exc: BaseException) -> str:
    """A failed task's error line: the exception's type and message (the cause's, for a wrapped error)."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip() or type(cause).__name__
    return f"{type(cause).__name__}: {text}" if not text.startswith(type(cause).__name__) else text
