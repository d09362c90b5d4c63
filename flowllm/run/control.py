"""What a process that runs tasks does with the run's control state (``flowllm ctl``; flowllm/rundir/control.py).

Every such process (the run's one process, or each worker, local or on Ray) follows ``.control/state.json``:

* ``paused``: no new turn starts (``ControlledGate.before_turn`` waits); model calls already sent finish;
* ``draining``: no new task starts; running ones finish;
* ``max_concurrent``: the run's tasks at once; this process runs its share (``TaskLimit`` is resized);
* ``cost_usd``: the run's budget (``experiment.budget.cost_usd``), asked after every turn and before each task;
* ``requeue``: failed tasks that run again at the end; the process that ran a task runs it again.

It tells the driver what it did in ``.control/followers/<n>.json`` (the state's version it applied, its tasks
running and waiting at a paused turn), which is how a command's answer can say every worker applied it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flowllm.core.coordination import RedisSpend
from flowllm.core.interfaces import Halt, TurnGate
from flowllm.datasets.task import Task
from flowllm.run.outcome import FAILED
from flowllm.run.progress import ProgressReporter
from flowllm.rundir.control import ControlPaths, ControlState, read_record, read_state, write_record
from flowllm.spend.spending import RunBudget, SpendBook

POLL_S = 0.1  # how often a process looks at the state file (a stat; read only when it changed)
FOLLOWERS_DIR = "followers"


def share(total: int, index: int, of: int) -> int:
    """Worker ``index``'s part of a whole-number limit, such that the parts of all ``of`` workers add up to it."""
    return total // of + (1 if index < total % of else 0)


class TaskLimit:
    """How many of this process's tasks run at once; a semaphore whose size can change while tasks wait."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self._changed = asyncio.Condition()

    async def __aenter__(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used < self.size)
            self.used += 1

    async def __aexit__(self, *exc: object) -> None:
        async with self._changed:
            self.used -= 1
            self._changed.notify_all()

    async def resize(self, size: int) -> None:
        async with self._changed:
            self.size = size
            self._changed.notify_all()


@dataclass
class FollowerReport:
    """One process's line to the driver."""

    version: int = 0
    running: int = 0
    waiting: int = 0  # tasks waiting at a turn start (paused)
    limit: int = 0  # this process's tasks at once
    ended: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FollowerReport:
        number = {k: int(data.get(k, 0)) for k in ("version", "running", "waiting", "limit")}
        return cls(**number, ended=bool(data.get("ended")))


def follower_reports(paths: ControlPaths) -> list[FollowerReport]:
    folder = paths.folder / FOLLOWERS_DIR
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        data = read_record(path)
        if data is not None:
            found.append(FollowerReport.from_dict(data))
    return found


@dataclass
class RunControl:
    """One process's view of the run's control state, applied as it changes."""

    run_dir: Path
    max_concurrent: int  # the run's, as configured
    index: int = 0  # this worker's number (0 in a one-process run)
    workers: int = 1
    on_requeue: Callable[[str], bool] | None = None  # True when the task is this process's and was queued
    on_budget: Callable[[float], None] | None = None
    state: ControlState = field(default_factory=ControlState)
    running: int = 0
    waiting: int = 0
    _seen: tuple[int, int, int] | None = None
    _requeued: int = 0  # entries of state.requeue handled
    _resumed: asyncio.Event = field(default_factory=asyncio.Event)
    _reported: FollowerReport | None = None

    def __post_init__(self) -> None:
        self.paths = ControlPaths(self.run_dir)
        self.limit = TaskLimit(share(self.max_concurrent, self.index, self.workers))
        self._resumed.set()

    @property
    def draining(self) -> bool:
        return self.state.draining

    async def refresh(self) -> None:
        """Apply the state file when it changed; report to the driver when something changed."""
        try:
            info = self.paths.state.stat()
            stamp: tuple[int, int, int] | None = (info.st_ino, info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = None
        if stamp is not None and stamp != self._seen:
            self._seen = stamp
            await self._apply(read_state(self.paths))
        self.report()

    async def _apply(self, state: ControlState) -> None:
        if state.version <= self.state.version and self.state.version:
            return
        old, self.state = self.state, state
        if state.paused:
            self._resumed.clear()
        else:
            self._resumed.set()
        total = state.max_concurrent if state.max_concurrent is not None else self.max_concurrent
        size = share(total, self.index, self.workers)
        if size != self.limit.size:
            await self.limit.resize(size)
        if state.cost_usd is not None and state.cost_usd != old.cost_usd and self.on_budget is not None:
            self.on_budget(state.cost_usd)
        for task_id in state.requeue[self._requeued :]:
            if self.on_requeue is not None:
                self.on_requeue(task_id)
        self._requeued = len(state.requeue)

    def report(self, ended: bool = False) -> None:
        now = FollowerReport(self.state.version, self.running, self.waiting, self.limit.size, ended)
        if now == self._reported:
            return
        folder = self.paths.folder / FOLLOWERS_DIR
        with contextlib.suppress(OSError):  # the control channel is a convenience: the run goes on without it
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_record(folder / f"{self.index}.json", now.__dict__)
            self._reported = now

    async def follow(self) -> None:
        """Until cancelled: look at the state file every POLL_S."""
        while True:
            with contextlib.suppress(OSError, ValueError):
                await self.refresh()
            await asyncio.sleep(POLL_S)

    async def before_turn(self) -> None:
        """Wait while the run is paused (a turn starts only when it is not)."""
        if self._resumed.is_set():
            return
        self.waiting += 1
        self.report()
        try:
            await self._resumed.wait()
        finally:
            self.waiting -= 1
            self.report()


@dataclass
class ControlledGate:
    """A task's gate with the run's control: a paused run starts no turn; a budget set while the run runs is
    asked after every turn, as the configured one is."""

    control: RunControl
    inner: TurnGate | None
    experiment: Any  # the Experiment: its budget and spend book as they are now

    async def before_turn(self) -> None:
        await self.control.before_turn()

    def after_turn(self, agent: str, turns: int, scope: str = "") -> Halt | None:
        halt = self.inner.after_turn(agent, turns, scope) if self.inner is not None else None
        if halt is not None or self.experiment.spend is None:
            return halt
        budget: RunBudget = self.experiment.settings.budget
        book = self.experiment.spend
        return budget.reached_by(book) if budget.active else None


def attach_control(experiment: Any, control: RunControl) -> None:
    """The Experiment follows the run's control from its next ``run`` on; a budget set while it runs replaces
    its own (asked before each task and after every turn). Under ``experiment.coordination`` it caps what every
    process sharing the budget spent, as a cap set on the command line does (it once counted this folder's
    spend alone when the run started with no cap)."""

    def set_cost(cost_usd: float) -> None:
        settings = experiment.settings
        settings.budget = replace(settings.budget, cost_usd=cost_usd)
        experiment._budget_halt = None
        if experiment.spend is None:
            shared = RedisSpend(settings.coordination) if settings.coordination is not None else None
            experiment.spend = SpendBook.of_run(experiment.recorder.run_dir, shared=shared)

    experiment.control = control
    control.on_budget = set_cost


class Scheduler:
    """Which of one process's tasks start, and how many at once, under the run's control (none: a semaphore)."""

    def __init__(
        self,
        control: RunControl | None,
        max_concurrent: int,
        todo: list[Task],
        tasks: list[Task],
        outcomes: dict[str, Any],
        progress: ProgressReporter | None = None,
    ) -> None:
        self.control = control
        self.progress = progress
        self.limit: Any = control.limit if control is not None else asyncio.Semaphore(max(1, max_concurrent))
        self.queued = {t.task_id for t in todo}  # waiting for a slot: a requeue of one would run it twice
        self.tasks = {t.task_id: t for t in tasks}
        self.outcomes = outcomes  # the run's, by task id
        self.start: Callable[[Task], object] | None = None  # schedules a task (the run's task group)
        self.drained = 0  # tasks not started because the run was drained

    @contextlib.asynccontextmanager
    async def slot(self, task_id: str) -> AsyncIterator[bool]:
        """A slot for the task; yields False when it must not start (the run is draining)."""
        async with self.limit:
            self.queued.discard(task_id)
            if self.control is None:
                yield True
                return
            if self.control.draining:  # flowllm ctl RUN drain: the task stays for a rerun
                self.drained += 1
                yield False
                return
            self.control.running += 1
            try:
                yield True
            finally:
                self.control.running -= 1

    def requeue(self, task_id: str) -> bool:
        """``flowllm ctl RUN requeue TASK``: a failed task of this process runs again, after those waiting."""
        done, task = self.outcomes.get(task_id), self.tasks.get(task_id)
        if task is None or done is None or done.status != FAILED or task_id in self.queued or self.start is None:
            return False
        try:
            self.start(task)
        except RuntimeError:  # the run's task group has finished: the run is ending
            return False
        self.queued.add(task_id)
        if self.progress is not None:
            self.progress.requeued(done)
        del self.outcomes[task_id]
        return True

    @contextlib.asynccontextmanager
    async def following(self) -> AsyncIterator[None]:
        """The control state followed while the tasks run."""
        control = self.control
        if control is None:
            yield
            return
        control.on_requeue = self.requeue
        follower = asyncio.create_task(control.follow())
        try:
            yield
        finally:
            control.on_requeue = None
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            control.report(ended=True)
