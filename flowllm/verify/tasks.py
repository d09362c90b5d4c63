"""Each task's result against its evidence: the answer is extracted again from the last saved wire reply, the
ground truth read from the dataset, the verdict recomputed by the scorer's rules, the epochs reduced again.

The outcomes returned carry the recomputed values, so the totals (totals.py) are recomputed from evidence, not
from what ``result.json`` says.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import OmegaConf

from flowllm.agent.answer import extract_answer, last_boxed
from flowllm.config.schema import Reducer
from flowllm.datasets.task import Task
from flowllm.run.epochs import epoch_score, reduce_entries
from flowllm.run.outcome import BUDGET, COMPLETED, FAILED, LIMIT, TaskOutcome, unscored_or
from flowllm.run.replay_audit import is_scored
from flowllm.rundir.layout import RESULT_FILE
from flowllm.rundir.results import TaskResult
from flowllm.scoring.scorers import ExactScorer, GaiaScorer
from flowllm.verify.evidence import RunEvidence
from flowllm.verify.findings import Audit
from flowllm.verify.replies import Normalizers, final_reply
from flowllm.verify.totals import saved_choice

__all__ = ["check_tasks", "expected_correct"]

Rules = Callable[[Task, str | None], bool | None]
ALL_NODES = "all"  # recorder.snapshot: every node's files kept (errors, none: fewer)
RULES: dict[str, Rules] = {"gaia": GaiaScorer().rules, "exact": ExactScorer().rules}


def expected_correct(result: TaskResult, task: Task, answer: str | None, rules: Rules) -> bool | None:
    """``correct`` as the evidence gives it for one run of a task (one epoch, or a task without epochs).

    A replay that parted from the saved run is unscored; a finished task (completed, or ended by a per-task
    limit and scored on its partial answer) is scored on its answer; a failed one is wrong where there is a
    ground truth; a budget-stopped one is unfinished: not scored."""
    if not is_scored(result.replay):
        return None
    status = result.status
    if status == BUDGET:
        return None
    if status == COMPLETED or (status == LIMIT and result.scored):
        return rules(task, answer)
    return unscored_or(task, False) if status in (FAILED, LIMIT) else None


class TaskChecker:
    """Checks one run's task results; keeps one normaliser per wire protocol for all of them."""

    def __init__(self, ev: RunEvidence, audit: Audit) -> None:
        self.ev = ev
        self.audit = audit
        provider = OmegaConf.to_container(ev.cfg.provider, resolve=False)
        self.normalizers = Normalizers(provider if isinstance(provider, dict) else {})  # type: ignore[arg-type]
        recorder = ev.cfg.get("recorder") or {}
        self.snapshot = str(recorder.get("snapshot") or ALL_NODES)
        scorer = str(ev.cfg.dataset.get("scorer") or "gaia")
        self.rules = RULES.get(scorer)
        if self.rules is None:
            audit.skip(f"verdicts of the {scorer} scorer are taken as recorded (a model judged them)")

    def answer(self, result: TaskResult, task: Task, epoch: int | None, file: str) -> str | None:
        """The answer the evidence gives, checked against the saved one; the saved one when not readable."""
        saved = result.answer
        if result.status == FAILED:
            self.audit.check(file, "answer", saved, None, "a failed task gave no answer")
            return None
        if result.status == BUDGET and result.error is not None:
            # Its last attempt failed, then the budget kept the next one from starting: no answer, whatever the
            # failed attempt's last reply said before it failed (a timeout in a tool, an error on a later call).
            self.audit.check(file, "answer", saved, None, "its last attempt failed and gave no answer")
            return None
        reply = final_reply(self.ev.layout.conversation(task.task_id, "", epoch), self.normalizers)
        if reply.file is None and self.snapshot != ALL_NODES:  # the run kept no node files for this task
            self.audit.skip(f"answers of tasks whose replies were not kept (recorder.snapshot={self.snapshot})")
            return saved if isinstance(saved, str) else None
        if reply.text is None:
            self.audit.check(file, "answer", saved, f"(no readable reply: {reply.problem})")
            return saved if isinstance(saved, str) else None
        text = reply.text
        recomputed = extract_answer(text) if result.status == COMPLETED else last_boxed(text)
        evidence = f"the last reply, {self.ev.rel(reply.file)}" if reply.file is not None else ""
        self.audit.check(file, "answer", saved, recomputed, evidence)
        return recomputed

    def one_run(self, result: TaskResult, task: Task, epoch: int | None, file: str) -> bool | None:
        """Check one run of a task (answer, ground truth, verdict); returns the recomputed verdict."""
        self.audit.check(file, "ground_truth", result.ground_truth, task.ground_truth, "the dataset")
        answer = self.answer(result, task, epoch, file)
        # A judge's verdict is taken as recorded, but the tallies' rules still apply to it: a task the budget
        # stopped, a failed one or a replay that parted from the saved run has no verdict of the judge's to count.
        rules = self.rules or (lambda _task, _answer: result.correct)
        correct = expected_correct(result, task, answer, rules)
        if result.status != BUDGET:
            how = "scored again by the scorer's rules" if self.rules is not None else "the judge's verdict, as counted"
            self.audit.check(file, "correct", result.correct, correct, how)
        return correct

    def epochs(self, result: TaskResult, task: Task, file: str) -> TaskOutcome:
        """A task over epochs: each epoch checked, its log entries against the epochs' results, the reduction."""
        saved = self.ev.epoch_results.get(task.task_id, {})
        entries = [dict(e) for e in result.epoch_log]
        for number, entry in enumerate(entries, start=1):
            epoch_result = saved.get(number)
            epoch_file = self.ev.rel(self.ev.layout.records(task.task_id, number) / RESULT_FILE)
            if epoch_result is None:
                self.audit.check(file, f"epoch_log[{number - 1}]", "an epoch", "no result.json for it", epoch_file)
                continue
            correct = self.one_run(epoch_result, task, number, epoch_file)
            for key in ("status", "answer"):
                self.audit.check(file, f"epoch_log[{number - 1}].{key}", entry.get(key), getattr(epoch_result, key))
            if epoch_result.status != BUDGET:  # an epoch the budget stopped has no verdict to compare
                self.audit.check(file, f"epoch_log[{number - 1}].correct", entry.get("correct"), correct)
            entry["correct"] = correct
        reducer = saved_choice(Reducer, result.epoch_reducer or self.ev.cfg.experiment.epoch_reducer)
        score = reduce_entries(entries, reducer) if entries else None
        stopped = any(e.status == BUDGET for e in saved.values())
        if stopped:  # an epoch the budget stopped leaves the task unfinished: a rerun runs the rest
            self.audit.check(file, "status", result.status, BUDGET, "an epoch of it the budget stopped")
        if stopped or result.status == BUDGET or not is_scored(result.replay):
            score = None  # unfinished, or an epoch did not replay: the epochs are not reduced
        else:
            self.audit.check(file, "score", result.score, score, f"the epochs reduced by {reducer}")
            self.audit.check(file, "correct", result.correct, epoch_score(score))
        outcome = TaskOutcome.from_result(result)
        outcome.epoch_log, outcome.score, outcome.correct = entries, score, epoch_score(score)
        if stopped:
            outcome.status = BUDGET
        outcome.ground_truth = task.ground_truth
        return outcome

    def task(self, task: Task) -> TaskOutcome | None:
        result = self.ev.results.get(task.task_id)
        if result is None:
            return None
        file = self.ev.rel(self.ev.layout.result(task.task_id))
        self.audit.check(file, "task_id", result.task_id, task.task_id)
        if result.epochs > 1:
            return self.epochs(result, task, file)
        correct = self.one_run(result, task, None, file)
        outcome = TaskOutcome.from_result(result)
        outcome.correct, outcome.ground_truth = correct, task.ground_truth
        return outcome


def check_tasks(ev: RunEvidence, audit: Audit) -> list[TaskOutcome]:
    """Every task with a result, checked; the outcomes (dataset order) with the recomputed verdicts."""
    checker = TaskChecker(ev, audit)
    outcomes = []
    for task in ev.tasks:
        outcome = checker.task(task)
        if outcome is not None:
            outcomes.append(outcome)
    return outcomes
