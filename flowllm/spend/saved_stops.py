"""Where a replay stops: where the saved run stopped, not where its own budget would.

A replay bills nothing (its replies are the saved run's, served again), so neither the run's budget nor a
per-task limit measured on the ledger ever acts in it: the tasks the saved run's budget stopped would run on,
and those it never started would start. Which task a budget stops depends on the order the saved run's calls
were billed in, which a replay (with other workers, other timing) does not repeat. So under ``provider=replay``
(not a fork: a fork's live turns are billed and its gate is the live one) the saved run's record decides:

* a task the saved run never started (its budget ended the run first) is not started;
* an epoch or a further attempt the saved run's budget kept from starting does not start, and a further attempt
  the saved run made is made, whatever pass@k's rule says now (``TaskOutcome.retry_settled``);
* a conversation of a task the saved run stopped (status ``budget`` or ``limit``) halts after the turn that
  has no next turn in the saved run, with the saved run's reason.

Only the reason of a halt (``halt_detail``, the saved run's words) is taken from the saved result: every turn is
still replayed and audited, and the replay's own result (its status, turns and usage) is compared with the saved
one, so a saved result whose status or turns were changed does not reproduce.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import orjson

from flowllm.config.provider_schema import ProviderConfig
from flowllm.core.interfaces import Halt, TurnGate
from flowllm.rundir.epochs import current_epoch
from flowllm.rundir.layout import RESULT_FILE, RunLayout, TurnDirs
from flowllm.rundir.results import RunSummary, TaskResult
from flowllm.rundir.store import local_run
from flowllm.spend.spending import STATUS_BUDGET, STATUS_LIMIT

__all__ = ["REPLAYED_BUDGET", "SavedGate", "SavedStops"]

# How a replay's summary says the saved run's budget ended it (the replay bills nothing: its own never does).
REPLAYED_BUDGET = "the replayed run's budget ended it"


class SavedStops:
    """The saved run's stops, read from its results (``TaskResult``) and its summary, each file once."""

    def __init__(self, run_dir: Path) -> None:
        self.layout = RunLayout(run_dir)
        self.turn_dirs = TurnDirs(self.layout)
        self._results: dict[tuple[str, int | None], TaskResult | None] = {}
        self._lock = threading.Lock()
        self.ended_run = False  # the saved run's budget ended it: the tasks it has no result for never started
        self.reason: str | None = None  # then: why, as the replay's summary says it
        if self.layout.summary.is_file():
            summary = RunSummary.from_dict(orjson.loads(self.layout.summary.read_bytes()))
            # A replay's own budget never ends it: that it stopped tasks says the run it replayed was ended.
            stopped = summary.budget is not None and bool(summary.budget.stopped_tasks) and not summary.interrupted
            self.ended_run = summary.budget_ended_run or stopped
            said = summary.budget.reason if summary.budget is not None else None
            if self.ended_run:
                kept = said and said.startswith(REPLAYED_BUDGET)  # a replay of a replay: said once
                self.reason = said if kept else f"{REPLAYED_BUDGET}: {said}" if said else REPLAYED_BUDGET

    @classmethod
    def of_replay(cls, pcfg: ProviderConfig) -> SavedStops | None:
        """The stops of the run a plain replay serves (``provider=replay`` without a fork); None otherwise."""
        if pcfg.protocol != "replay" or pcfg.fork is not None or not pcfg.run_dir:
            return None
        return cls(local_run(pcfg.run_dir))  # a folder, or a store's URL read from its local copy

    def result(self, task_id: str, epoch: int | None) -> TaskResult | None:
        """The saved result of the task (``epoch`` None) or of one of its epochs; None when there is none."""
        key = (task_id, epoch)
        with self._lock:
            if key in self._results:
                return self._results[key]
        path = self.layout.records(task_id, epoch) / RESULT_FILE if epoch is not None else self.layout.result(task_id)
        found = TaskResult.from_dict(orjson.loads(path.read_bytes())) if path.is_file() else None
        with self._lock:
            self._results[key] = found
        return found

    def stopped_before(self, task_id: str, attempt: int = 1) -> bool:
        """Whether the saved run's budget kept this task (outside any epoch), the running epoch or ``attempt``
        from starting."""
        epoch = current_epoch()
        saved = self.result(task_id, epoch)
        if saved is None:
            if epoch is None:
                return self.ended_run
            whole = self.result(task_id, None)
            return whole is not None and whole.status == STATUS_BUDGET
        return saved.status == STATUS_BUDGET and saved.attempts < attempt

    def went_on(self, task_id: str, attempt: int) -> bool:
        """Whether the saved run ran another attempt at the task (in the running epoch) after ``attempt``."""
        saved = self.result(task_id, current_epoch())
        return saved is not None and saved.attempts > attempt

    def gate(self, task_id: str, live: TurnGate | None) -> SavedGate:
        """The gate of one attempt at ``task_id`` in the running epoch; ``live`` (the replay's own limits) is asked
        where the saved run went on."""
        return SavedGate(self, task_id, current_epoch(), live)


class SavedGate:
    """A replayed attempt's gate: it halts a conversation where the saved run's gate halted it; elsewhere the
    replay's own gate (``live``: a limit the replay sets, such as fewer turns, still acts) decides."""

    def __init__(self, stops: SavedStops, task_id: str, epoch: int | None, live: TurnGate | None = None) -> None:
        self.stops = stops
        self.task_id = task_id
        self.epoch = epoch
        self.live = live

    async def before_turn(self) -> None:
        if self.live is not None:
            await self.live.before_turn()

    def after_turn(self, agent: str, turns: int, scope: str = "") -> Halt | None:
        live = self.live.after_turn(agent, turns, scope) if self.live is not None else None
        saved = self.stops.result(self.task_id, self.epoch)
        if saved is None or saved.status not in (STATUS_BUDGET, STATUS_LIMIT):
            return live
        if os.path.isdir(self.stops.turn_dirs.turn(self.task_id, turns + 1, scope, self.epoch)):
            return live  # the saved conversation went on
        if saved.status == STATUS_LIMIT:
            return Halt("limit", saved.limit, saved.halt_detail or "")
        return Halt("budget", None, saved.halt_detail or "")
