"""An experiment: every selected task of a dataset through the agent, concurrently, scored and recorded.

A task that fails (an exception, a timeout, a missing attachment) is recorded as failed with its error and never
stops the others. Resuming is driven by the files alone, so it survives any crash, SIGKILL included:

* ``tasks/<id>/result.json`` is written last (atomically, after the task's node records), so a task with a
  completed result is finished and is skipped by a rerun into the same run directory;
* a task with a failed or budget-stopped result, an unreadable or invalid result or none at all is run again:
  its workspace and records are wiped first, so nothing of an interrupted attempt is counted twice, but its
  saved turns are moved aside and the task resumes from them (flowllm/run/resume.py): their replies are served
  again, unpaid, while the requests are the same, and the task goes live at the first turn without one;
* a completed result is not trusted for its score: ``correct`` is recomputed from its answer and the dataset.

While a task runs its workspace lives outside the run directory (``flowllm.run.workspaces``); when the
attempt ends it moves to ``tasks/<id>/workspace``. A task id that cannot name a folder is mapped to a safe name
(``flowllm.rundir.taskdirs``); ``result.json`` keeps the id.

``attempts`` > 1 is pass@k by retry-until-correct: a task is run up to k times and stops at the first correct
answer, or at one no attempt can prove wrong (``TaskOutcome.retry_settled``). Earlier attempts' turn folders are
kept under ``tasks/<id>/attempts/<n>/``; the task's own folder holds the last one. ``epochs`` > 1 runs each
task N independent times (flowllm/run/epochs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowllm.agent.answer import last_boxed
from flowllm.agent.loop import Agent
from flowllm.agent.results import AgentResult
from flowllm.config.schema import Reducer
from flowllm.core.coordination import Coordination, RedisSpend
from flowllm.core.interfaces import Provider, TurnGate
from flowllm.core.types import Usage
from flowllm.datasets.gaia import task_prompt
from flowllm.datasets.task import Task
from flowllm.engine import Recorder
from flowllm.engine.heap import run_collector
from flowllm.providers.replay import ReplayMissError
from flowllm.run.control import ControlledGate, RunControl, Scheduler
from flowllm.run.epochs import epoch_score, reduce_entries
from flowllm.run.outcome import (
    BUDGET,
    COMPLETED,
    FAILED,
    FINISHED,
    LIMIT,
    TaskOutcome,
    describe_error,
    read_outcome,
    stopped_by_budget,
    unscored_or,
)
from flowllm.run.progress import ProgressReporter
from flowllm.run.replay_audit import ReplayAudit, is_scored
from flowllm.run.resume import TaskResume, clear_epoch_dir, clear_task_dir
from flowllm.run.workspaces import WorkspaceRoot
from flowllm.rundir.attempts import running_attempt, shelve_attempt
from flowllm.rundir.epochs import current_epoch, running_epoch
from flowllm.rundir.layout import RESULT_FILE, STATE_FILE, WORKSPACE_DIR
from flowllm.rundir.taskdirs import task_folder_name
from flowllm.scoring import GaiaScorer, Score, Scorer
from flowllm.spend.saved_stops import SavedStops
from flowllm.spend.spending import RunBudget, SpendBook, TaskGate, TaskLimits
from flowllm.tools import PoolSettings, ToolCatalog, open_tool_catalog, open_tool_pool

log = logging.getLogger(__name__)


__all__ = ["Experiment", "ExperimentSettings", "task_prompt"]


@dataclass
class ExperimentSettings:
    max_concurrent: int = 4  # tasks at once (auto: the ceiling)
    adaptive_ceiling: int | None = None  # max_concurrent=auto[:N]: calls in flight found by AIMD, up to N
    task_timeout_s: float = 900.0
    resume: bool = True
    attempts: int = 1  # pass@k: up to k attempts per task, stopping at the first correct one
    epochs: int = 1  # independent runs of every task (flowllm/run/epochs.py)
    epoch_reducer: Reducer = Reducer.mean
    limits: TaskLimits = field(default_factory=TaskLimits)  # agent.limits
    budget: RunBudget = field(default_factory=RunBudget)  # experiment.budget
    # experiment.coordination: the budget's spend (and the provider's limits) kept in Redis with other processes
    coordination: Coordination | None = None


@dataclass
class RunResult:
    outcomes: list[TaskOutcome]  # dataset order; tasks that never finished are absent
    interrupted: bool
    resumed: int  # tasks skipped because an earlier run completed them
    # server -> why (disabled, failed to start); None when this process could not know (the parent of workers)
    tools_unavailable: dict[str, str] | None = field(default_factory=dict)
    # Seconds spent starting the run's shared tool servers, once before the first task (a task's own servers'
    # start-up is in its timing.json); None when this process could not know (the parent of workers).
    tools_start_s: float | None = 0.0
    budget_halt: str | None = None  # why the budget stopped new tasks, as this process saw it (run/budget_report.py)


class Experiment:
    """Runs tasks with one provider, one agent (pipeline + runner) and one tool configuration."""

    def __init__(
        self,
        *,
        agent: Agent,
        provider: Provider,
        tools: PoolSettings,
        recorder: Recorder,
        settings: ExperimentSettings,
        progress: ProgressReporter | None = None,
        open_tools: Callable[..., Any] = open_tool_pool,
        audit: ReplayAudit | None = None,
        scorer: Scorer | None = None,
        breakdown: Iterable[str] = (),
        tools_unavailable: dict[str, str] | None = None,
        resume: TaskResume | None = None,
        stops: SavedStops | None = None,
    ) -> None:
        # ``settings`` were checked where they were read (flowllm/setup/settings.py).
        self.agent = agent
        self.provider = provider
        self.tools = tools  # loaded once by the run's set-up; each task's pool starts from them
        self.recorder = recorder
        self.settings = settings
        self.progress = progress
        self.open_tools = open_tools
        self.audit = audit
        self.stops = stops  # a replay's stops: the saved run's, not its own unbilled spend's (spend/saved_stops.py)
        self.resume = resume  # resumes an unfinished task from its saved turns (flowllm/run/resume.py)
        self.scorer: Scorer = scorer or GaiaScorer()
        self.breakdown = tuple(breakdown)
        # Tools the run knows it cannot offer (tool-vision without a provider that takes images).
        self.tools_unavailable = dict(tools_unavailable or {})
        # Tools are listed once per run; each task's pool then starts a server on its first call only.
        self.tools_catalog: ToolCatalog | None = None
        # Where tasks' code runs: outside the run directory, so no relative path leads to its answers.
        self.workspaces = WorkspaceRoot()
        self.stop_reason: str | None = None  # set when a task's records could not be written
        # Outcomes whose result.json has been handed to the recorder: a Ctrl-C that lands while it is being
        # written still counts the task, because the file will be on disk when the run ends.
        self._handed_over: dict[str, TaskOutcome] = {}
        # The run's ledger, read as every process appends to it: per-task limits and the run's budget.
        capped = settings.limits.active or settings.budget.active
        shared = RedisSpend(settings.coordination) if settings.coordination is not None and capped else None
        self.spend = SpendBook.of_run(recorder.run_dir, shared=shared) if capped else None
        self._budget_halt: str | None = None  # the budget's halt, once seen (said once on the console)
        self.control: RunControl | None = None  # flowllm ctl: run/control.py

    def previous_outcome(self, task: Task) -> TaskOutcome | None:
        if not self.settings.resume:
            return None
        outcome = read_outcome(self.recorder.layout.result(task.task_id), task, self.scorer.rules)
        if outcome is not None and outcome.epochs != self.settings.epochs:
            return None  # another number of epochs: the task runs again (the epochs it has are kept)
        if outcome is not None and outcome.epochs > 1 and outcome.scored_again:
            return None  # an epoch whose answer could not be scored runs again; the others are kept
        return outcome if outcome is not None and outcome.status in FINISHED else None

    def _records_dir(self, task: Task) -> Path:
        """The folder of the running attempt's records: the task's, or its epoch's in an epochs run."""
        return self.recorder.layout.records(task.task_id, current_epoch())

    def _fresh_task_dir(self, task: Task) -> None:
        """A (re)run starts clean; an unfinished task's turns are kept aside to resume from (flowllm/run/resume.py)."""
        self.recorder.forget_task_errors(task.task_id)
        store = self.resume.store if self.resume is not None else None
        clear_task_dir(self.recorder.layout, task.task_id, self.settings.epochs, store)

    def _workspace(self, task: Task) -> Path:
        """A fresh workspace for the task, outside the run directory (``workspaces``), attachment copied in; made
        here only for an attachment, else by the first tool that works in it."""
        workspace = self.workspaces.fresh(task_folder_name(task.task_id))
        if task.attachment is not None:
            if not task.attachment.is_file():
                raise FileNotFoundError(f"attachment '{task.file_name}' is missing from the dataset folder")
            workspace.mkdir(exist_ok=True)
            shutil.copy2(task.attachment, workspace / Path(task.file_name or "").name)
        return workspace

    async def _keep_workspace(self, task: Task) -> None:
        """After an attempt: its workspace moves into ``tasks/<id>/workspace``, where it is kept for reading. One
        rename on the event loop when it can; a copy (another filesystem) or a replacement in a thread."""
        name, target = task_folder_name(task.task_id), self._records_dir(task) / WORKSPACE_DIR
        if not self.workspaces.keep_by_rename(name, target):
            # Shielded: a cancelled task still keeps its workspace (the move finishes in its thread).
            await asyncio.shield(asyncio.to_thread(self.workspaces.keep, name, target))

    def _shelve_attempt(self, task: Task, number: int) -> None:
        """Move a finished attempt's records aside so the next attempt starts from the task folder again."""
        self.recorder.flush()  # the background writer must not still be writing into the folders we move
        shelve_attempt(self._records_dir(task), number)
        self.recorder.discard_task(task.task_id)

    async def score(self, task: Task, answer: str | None, attempt: int) -> Score:
        if task.ground_truth is None:  # nothing to score against (a test split): unscored, not wrong
            return Score(None)
        try:
            return await self.scorer.score(task, answer, attempt=attempt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a scorer bug must not lose the agent's work: record it on the task
            log.debug("scoring task %s failed", task.task_id, exc_info=True)
            return Score(None, error=f"scoring failed: {describe_error(exc)}")  # not known, not wrong

    def categories(self, task: Task) -> dict[str, Any]:
        return {name: task.metadata.get(name) for name in self.breakdown}

    async def attempt(self, task: Task, number: int = 1) -> TaskOutcome:
        """One attempt at a task, scored; never raises except on cancellation."""
        started = time.perf_counter()
        tools_start = 0.0
        result: AgentResult | None = None
        error: str | None = None
        missed = False
        if self.audit is not None:
            self.audit.forget(task.task_id)
        if self.resume is not None:
            self.resume.begin(task.task_id, number)
        gate: TurnGate | None = None
        if self.spend is not None:
            gate = TaskGate(task.task_id, self.spend, self.settings.limits, self.settings.budget)
        gate = self.stops.gate(task.task_id, gate) if self.stops is not None else gate
        gate = ControlledGate(self.control, gate, self) if self.control is not None else gate
        try:
            workspace = self._workspace(task)
            try:
                async with asyncio.timeout(self.settings.task_timeout_s):
                    async with self._open_tools(task, workspace) as tools:
                        try:
                            result = await self.agent.run(
                                task.task_id, task_prompt(task), self.provider, tools, workspace=workspace, gate=gate
                            )
                        finally:
                            tools_start = tools.startup_seconds if tools is not None else 0.0
            finally:
                await self._keep_workspace(task)
        except TimeoutError:
            error = f"task timed out after {self.settings.task_timeout_s:g}s (experiment.task_timeout_s)"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = describe_error(exc)
            missed = isinstance(getattr(exc, "cause", None) or exc, ReplayMissError)
            log.debug("task %s failed", task.task_id, exc_info=True)
        wall = time.perf_counter() - started
        replay = self.audit.verdict(task.task_id, missed=missed) if self.audit is not None else None
        resumed = self.resume.end(task.task_id) if self.resume is not None else (0, None)
        if result is None:
            return self._failed(task, error, wall, replay, tools_start).resumed_from(*resumed)
        outcome = self._completed(task, result, wall, replay, tools_start).resumed_from(*resumed)
        if result.halt is not None:
            # Ended by a limit or the budget: its answer is the one it gave (boxed), if it gave one.
            halt = result.halt
            outcome.status, outcome.limit, outcome.halt_detail = halt.status, halt.limit, halt.detail
            outcome.answer = last_boxed(result.final_text)
            outcome.scored = outcome.status == LIMIT and self.settings.limits.score_partial
            if not outcome.scored:
                return outcome
        outcome.apply_score(await self.score(task, outcome.answer, number))
        if not is_scored(replay):
            outcome.correct = None  # the saved replies answered another conversation: the score is not known
        return outcome

    def _failed(
        self, task: Task, error: str | None, wall: float, replay: dict[str, Any] | None, tools_start: float
    ) -> TaskOutcome:
        """An attempt that gave no result (an exception, a timeout): failed, with its error."""
        failed = TaskOutcome(
            task_id=task.task_id,
            status=FAILED,
            answer=None,
            ground_truth=task.ground_truth,
            correct=unscored_or(task, False) if is_scored(replay) else None,
            turns=0,
            usage=Usage(),
            error=error,
            level=task.level,
            wall_seconds=wall,
            replay=replay,
            categories=self.categories(task),
        )
        failed._tools_start_s = tools_start
        return failed

    def _completed(
        self, task: Task, result: AgentResult, wall: float, replay: dict[str, Any] | None, tools_start: float
    ) -> TaskOutcome:
        """An attempt the agent finished, not yet scored."""
        outcome = TaskOutcome(
            task_id=task.task_id,
            status=COMPLETED,
            answer=result.answer,
            ground_truth=task.ground_truth,
            correct=False,
            turns=result.turns,
            usage=result.usage,
            level=task.level,
            stop=result.stop,
            tool_calls=result.tool_calls,
            bad_tool_calls=result.bad_tool_calls,
            failed_tool_calls=result.failed_tool_calls,
            infra_tool_failure_causes=result.infra_tool_failures,
            repairs=result.repairs,
            wall_seconds=wall,
            replay=replay,
            categories=self.categories(task),
        )
        outcome._tools_start_s = tools_start
        return outcome

    def budget_reached(self, task: Task, attempt: int = 1) -> bool:
        """Whether the run's budget is spent (no task or attempt starts then); said once on the console. A replay
        starts what the saved run started: its own spend is nothing."""
        if self.stops is not None:
            return self.stops.stopped_before(task.task_id, attempt)
        try:
            halt = self.settings.budget.reached(self.spend.total(), self.spend.spender) if self.spend else None
        except OSError as exc:  # the shared spend's Redis went away: no task starts without knowing the spend
            self._stop(f"the run's spend cannot be read: {exc}")
            return True
        if halt is not None and self._budget_halt is None:
            self._budget_halt = halt.detail
            log.warning("flowllm: %s: no new task starts; running tasks stop after their current turn", halt.detail)
        return halt is not None

    async def run_task(self, task: Task) -> TaskOutcome:
        """All attempts (and epochs) at a task; writes its ``result.json`` once, at the end."""
        self._fresh_task_dir(task)
        if self.settings.epochs > 1:
            outcome = await self._run_epochs(task)
        else:
            outcome = await self._run_attempts(task)
            if self.recorder.writes_while_running:  # its node records must have landed first
                await self.recorder.flushed()
                self._fail_if_unrecorded(outcome)
        # Timings beside the result, so that two identical runs compare with plain `diff -r`.
        self.recorder.finish_task(task.task_id, outcome.to_dict(), timing=outcome.timing_dict())
        self._handed_over[task.task_id] = outcome
        await self.recorder.flushed()
        self._fail_if_unrecorded(outcome)  # result.json itself did not land: not finished, it reruns
        if self.resume is not None:  # the task's folder holds every turn again
            await asyncio.to_thread(self.resume.store.drop, task.task_id, None)
        return outcome

    async def _run_epochs(self, task: Task) -> TaskOutcome:
        """Each epoch in its own folder, one after another; a completed epoch of an earlier run is kept."""
        done: list[TaskOutcome] = []
        for epoch in range(1, self.settings.epochs + 1):
            with running_epoch(epoch):
                folder = self._records_dir(task)
                previous = None
                if self.settings.resume:
                    previous = read_outcome(folder / RESULT_FILE, task, getattr(self.scorer, "rules", None))
                if previous is not None and previous.status == COMPLETED and not previous.score_error:
                    done.append(previous)
                    continue
                if self.budget_reached(task):  # the rest of the epochs wait for a rerun with a higher budget
                    return self._budget_stopped(task, done, f"the run's budget was spent before epoch {epoch}")
                store = self.resume.store if self.resume is not None else None
                await asyncio.to_thread(clear_epoch_dir, folder, task.task_id, epoch, store)
                outcome = await self._run_attempts(task)
                await self.recorder.flushed()
                self._fail_if_unrecorded(outcome)
                self.recorder.write_digests(task.task_id)  # the running epoch's
                self.recorder.write_result(folder, outcome.to_dict(), outcome.timing_dict())
                if store is not None:
                    await self.recorder.flushed()
                    await asyncio.to_thread(store.drop, task.task_id, epoch)
                done.append(outcome)
            if outcome.status == BUDGET:
                return self._budget_stopped(task, done, outcome.halt_detail)
            if self.stop_reason is not None:
                break
        return self._combine_epochs(task, done)

    def _budget_stopped(self, task: Task, epochs: list[TaskOutcome], detail: str | None) -> TaskOutcome:
        """A task whose epochs the budget cut short: unfinished (status budget), never reduced over fewer epochs;
        a rerun keeps its completed epochs and runs the others."""
        if epochs:
            stopped = self._combine_epochs(task, epochs)
        else:
            stopped = TaskOutcome(task.task_id, BUDGET, None, task.ground_truth, False, 0, Usage(), level=task.level)
            stopped.categories = self.categories(task)
        stopped.status, stopped.correct, stopped.score, stopped.error = BUDGET, False, None, None
        stopped.stop, stopped.halt_detail, stopped.scored = BUDGET, detail, False
        return stopped

    def _combine_epochs(self, task: Task, epochs: list[TaskOutcome]) -> TaskOutcome:
        """The task's outcome over its epochs: the last epoch's answer and turns, everything spent summed."""
        last = epochs[-1]
        entries = [o.epoch_entry(n) for n, o in enumerate(epochs, start=1)]
        reducer = self.settings.epoch_reducer
        score = reduce_entries(entries, reducer)
        failed = [o for o in epochs if o.status not in (COMPLETED, BUDGET)]
        combined = TaskOutcome.from_dict(last.to_dict())
        combined.status = FAILED if failed or len(epochs) < self.settings.epochs else COMPLETED
        if any(o.status == BUDGET for o in epochs):  # unfinished, as its stopped epoch is: a rerun runs the rest
            combined.status = BUDGET
        if failed:
            combined.error = f"{len(failed)} of {len(epochs)} epochs failed; the first: {failed[0].error}"
        elif len(epochs) < self.settings.epochs:
            combined.error = f"only {len(epochs)} of {self.settings.epochs} epochs ran"
        combined.epochs = self.settings.epochs
        combined.epoch_log = entries
        combined.epoch_reducer = str(reducer)
        combined.score = score
        combined.correct = epoch_score(score)  # None: no epoch was scored
        combined.usage = sum((o.usage for o in epochs), Usage())
        combined.wall_seconds = sum(o.wall_seconds for o in epochs)
        combined.tool_calls = sum(o.tool_calls for o in epochs)
        combined.bad_tool_calls = sum(o.bad_tool_calls for o in epochs)
        combined.failed_tool_calls = sum(o.failed_tool_calls for o in epochs)
        combined.turns = sum(o.turns for o in epochs)
        combined.resumed_turns = sum(o.resumed_turns for o in epochs)
        combined.attempts = 1 + sum(o.attempts - 1 for o in epochs)  # retries counted, as with one epoch
        combined.attempt_log = []
        repairs: Counter[str] = Counter()
        for o in epochs:
            repairs.update(o.repairs)
        combined.repairs = dict(repairs)
        combined._attempt_timings = [t for o in epochs for t in o._attempt_timings]
        # A replay is exact only when every epoch replayed exactly: the first that did not speaks for the task.
        off = [(n, o.replay) for n, o in enumerate(epochs, 1) if o.replay and o.replay.get("status") != "exact"]
        if off:
            combined.replay = {**off[0][1], "epoch": off[0][0]}
        if not is_scored(combined.replay):  # an epoch that did not replay: the task's score is not known
            combined.score, combined.correct = None, None
        return combined

    async def _run_attempts(self, task: Task) -> TaskOutcome:
        """The attempts of one run of a task (retry until correct, up to ``attempts``), not yet written."""
        log_entries: list[dict[str, Any]] = []
        timings: list[dict[str, Any]] = []
        usage = Usage()
        wall, resumed = 0.0, 0
        outcome: TaskOutcome | None = None
        for number in range(1, self.settings.attempts + 1):
            if outcome is not None and self.budget_reached(task, number):  # pass@k: no attempt on a spent budget
                outcome.status, outcome.correct, outcome.scored = BUDGET, False, False  # as _budget_stopped says it
                outcome.halt_detail = f"the run's budget was spent before attempt {number}"
                break
            if outcome is not None:
                await asyncio.to_thread(self._shelve_attempt, task, number - 1)
            with running_attempt(number):
                outcome = await self.attempt(task, number)
            log_entries.append(outcome.attempt_entry(number))
            timings.append(
                {"attempt": number, "wall_seconds": outcome.wall_seconds, "tools_start_s": outcome._tools_start_s}
            )
            usage = usage + outcome.usage
            resumed += outcome.resumed_turns
            wall += outcome.wall_seconds
            # A replay runs the attempts its saved run ran: that run's retry rule may have been another.
            if outcome.retry_settled and (self.stops is None or not self.stops.went_on(task.task_id, number)):
                break
        assert outcome is not None
        outcome.resumed_turns = resumed  # every attempt's resumed calls (pass@k: each resumes from its own)
        outcome.attempts = len(log_entries)
        outcome.usage = usage
        outcome.wall_seconds = wall
        outcome.attempt_log = log_entries if len(log_entries) > 1 else []
        outcome._attempt_timings = timings
        # What the model or a tool echoed may hold a key: the table shows what the files hold, masked.
        outcome.answer = self.recorder.redactor.mask(outcome.answer)
        outcome.error = self.recorder.redactor.mask(outcome.error)
        # The caller flushes its node records next: a task whose records did not all land is failed.
        return outcome

    async def rescore(self, task: Task, outcome: TaskOutcome) -> TaskOutcome:
        """Score a saved answer again (a resume after a scoring error); rewrites the task's result.json."""
        outcome.apply_score(await self.score(task, outcome.answer, outcome.attempts))
        self.recorder.finish_task(task.task_id, outcome.to_dict())
        return outcome

    def _fail_if_unrecorded(self, outcome: TaskOutcome) -> None:
        """A write in the task's folder failed (a full disk): the task fails with the reason; no new task starts."""
        failure = self.recorder.task_write_error(outcome.task_id)
        if failure is None or outcome.error == f"the task's records could not be written: {failure}":
            return
        outcome.status = FAILED
        outcome.correct = None if outcome.ground_truth is None else False
        outcome.error = f"the task's records could not be written: {failure}"
        self._stop(failure)

    def _stop(self, reason: str) -> None:
        """No new task starts (the run's records cannot be written, its shared spend cannot be read); said once."""
        if self.stop_reason is None:
            self.stop_reason = reason
            log.error("flowllm: no new tasks start: %s (rerun into this folder to resume)", reason)

    def _open_tools(self, task: Task, workspace: Path) -> Any:
        state_file = self._records_dir(task) / STATE_FILE  # tools.task_state: one of the task's records
        if self.tools_catalog is not None:
            return self.open_tools(self.tools, workspace, catalog=self.tools_catalog, state_file=state_file)
        return self.open_tools(self.tools, workspace, state_file=state_file)

    async def _discover_tools(self, stack: contextlib.AsyncExitStack) -> None:
        """Check the servers once for the run; the run-scoped ones stay connected until ``stack`` closes.

        A catalog given by the caller (the preflight's, opened in this event loop) is the run's: its servers are
        already up and the caller stops them."""
        if self.open_tools is not open_tool_pool or self.tools_catalog is not None:
            return
        self.tools_catalog = await stack.enter_async_context(open_tool_catalog(self.tools))

    async def _rescore_unscored(self, tasks: list[Task], outcomes: dict[str, TaskOutcome]) -> None:
        """A completed task whose answer could not be scored (the judge failed) is scored again, not rerun."""
        rescore = [t for t in tasks if t.task_id in outcomes and outcomes[t.task_id].scored_again]
        if not rescore:
            return
        limit = asyncio.Semaphore(max(1, self.settings.max_concurrent))

        async def again(task: Task) -> None:
            async with limit:
                outcomes[task.task_id] = await self.rescore(task, outcomes[task.task_id])

        async with asyncio.TaskGroup() as group:
            for task in rescore:
                group.create_task(again(task))

    async def run(self, tasks: list[Task]) -> RunResult:
        """Run every task not completed before; outcomes come back in dataset order."""
        outcomes: dict[str, TaskOutcome] = {}
        todo: list[Task] = []
        for task in tasks:
            previous = self.previous_outcome(task)
            if previous is not None:
                outcomes[task.task_id] = previous
            else:
                todo.append(task)
        resumed = len(outcomes)
        await self._rescore_unscored(tasks, outcomes)
        tools_stack = contextlib.AsyncExitStack()
        if todo:
            await self._discover_tools(tools_stack)
        if self.progress:
            self.progress.start(total=len(tasks), already=list(outcomes.values()))
        scheduler = Scheduler(self.control, self.settings.max_concurrent, todo, tasks, outcomes, self.progress)

        async def bounded(task: Task) -> None:
            async with scheduler.slot(task.task_id) as start:
                if not start or self.stop_reason is not None:  # drained, or the run directory cannot be written
                    return
                if self.budget_reached(task):  # the run's budget is spent: the task stays for a rerun
                    stopped = stopped_by_budget(self.recorder.layout.result(task.task_id), task, self.scorer.rules)
                    if stopped is not None:  # an earlier session's budget stop: still this folder's record of it
                        outcomes[task.task_id] = stopped
                    return
                if self.progress:
                    self.progress.task_started(task.task_id)
                outcome = await self.run_task(task)
            outcomes[task.task_id] = outcome
            if self.progress:
                self.progress.task_done(outcome)

        interrupted = False
        try:
            with run_collector():  # the collector skips the start-up heap (engine/heap.py)
                async with scheduler.following(), asyncio.TaskGroup() as group:
                    scheduler.start = lambda task: group.create_task(bounded(task))  # a requeued task
                    for task in todo:
                        group.create_task(bounded(task))
        except asyncio.CancelledError:
            # Ctrl-C (asyncio.run cancels the main task): the running tasks were cancelled by the group and
            # wrote no result, so a rerun runs them again; what finished is kept.
            interrupted = True
        finally:
            if self.progress:
                self.progress.stop()
            await tools_stack.aclose()
            await self.recorder.flushed()
            await asyncio.to_thread(self.workspaces.close)
        for task_id, outcome in self._handed_over.items():
            if task_id not in outcomes:  # cancelled while its result.json was being written: it is on disk
                self._fail_if_unrecorded(outcome)
                outcomes[task_id] = outcome
        ordered = [outcomes[t.task_id] for t in tasks if t.task_id in outcomes]
        unavailable = dict(self.tools_catalog.unavailable) if self.tools_catalog is not None else {}
        unavailable.update(self.tools_unavailable)
        started = self.tools_catalog.startup_seconds if self.tools_catalog is not None else 0.0
        return RunResult(
            ordered,
            interrupted or self.stop_reason is not None or scheduler.drained > 0,
            resumed,
            tools_unavailable=unavailable,
            tools_start_s=round(started, 3),
            budget_halt=self._budget_halt,
        )
