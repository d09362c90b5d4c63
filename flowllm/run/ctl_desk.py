"""The driver's side of ``flowllm ctl``: reads the requests in the run folder's ``.control/``, answers each one,
logs it in ``history.jsonl`` and moves ``.control/state.json``, which every process of the run follows
(flowllm/run/control.py). Run by the run's one process (a task of its event loop) or by the parent of its workers
(in its polling loop).

A command that changes what the processes do (pause, resume, drain, set, requeue) is answered once every process
still running tasks has applied it (its report in ``.control/followers/``), or after ``ACK_WAIT_S`` with the
processes that had not yet.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowllm.run.control import FOLLOWERS_DIR, follower_reports
from flowllm.rundir.control import (
    ControlPaths,
    ControlState,
    CtlAnswer,
    CtlRequest,
    DriverInfo,
    log_command,
    read_record,
    save,
)
from flowllm.rundir.layout import RunLayout

MAX_CONCURRENT = 1024  # the most tasks at once a run may be set to
ACK_WAIT_S = 10.0  # how long an answer waits for the processes to apply a change
SETTABLE = ("experiment.max_concurrent", "experiment.budget.cost_usd")
COMMANDS = ("status", "pause", "resume", "drain", "stop", "set", "requeue")


class Refused(Exception):
    """A command the run cannot do; its message is the answer."""


def _sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: the run's own handler stops it (and its workers)


@dataclass
class _Pending:
    request: CtlRequest
    answer: CtlAnswer
    uid: int
    version: int
    since: float


@dataclass
class ControlDesk:
    """Answers ``flowllm ctl`` for one run while it runs."""

    run_dir: Path
    workers: int = 1
    shared_budget: bool = False  # experiment.coordination: the budget is the runs' together, each holds its own cap
    status: Callable[[], dict[str, Any]] = dict  # the host's figures: tasks total and done, the concurrency
    failed: Callable[[str], str | None] = lambda task_id: None  # why a task cannot be requeued (None: it can)
    stop: Callable[[], None] = _sigint
    owner: int = field(default_factory=os.getuid)
    clock: Callable[[], float] = time.monotonic
    state: ControlState = field(default_factory=ControlState)
    pending: list[_Pending] = field(default_factory=list)
    _requeued: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.paths = ControlPaths(self.run_dir)

    def open(self) -> None:
        """A fresh channel: nothing of an earlier session's pauses or requests applies to this one."""
        self.paths.make()
        shutil.rmtree(self.paths.folder / FOLLOWERS_DIR, ignore_errors=True)
        for stale in (*self.paths.requests.glob("*.json"), *self.paths.answers.glob("*.json")):
            stale.unlink(missing_ok=True)
        save(self.paths.state, self.state)
        save(self.paths.driver, DriverInfo.here())

    def close(self) -> None:
        """The channel is gone with the run: its folder too (history.jsonl keeps every command and answer), so a
        finished run's folder holds the same files whether or not it was steered, and ``ctl`` finds no run."""
        self.paths.driver.unlink(missing_ok=True)
        shutil.rmtree(self.paths.folder, ignore_errors=True)

    def poll(self) -> None:
        """Answer what came in; answer what the processes have applied since."""
        for path in sorted(self.paths.requests.glob("*.json")):
            with contextlib.suppress(OSError):
                self._take(path)
        self._settle()

    def _take(self, path: Path) -> None:
        uid = path.stat().st_uid
        data = read_record(path)
        path.unlink(missing_ok=True)
        if data is None:
            return
        try:
            request = CtlRequest.from_dict(data)
        except (KeyError, ValueError, TypeError):
            return
        if uid != self.owner:
            who = f"refused: the command came from user {uid}; only the run's owner (user {self.owner}) may steer it"
            self._answer(request, CtlAnswer(request.id, False, who), uid)
            return
        before = self.state.version
        try:
            answer = self._handle(request)
        except Refused as exc:
            answer = CtlAnswer(request.id, False, str(exc))
        if self.state.version != before:
            save(self.paths.state, self.state)
            self.pending.append(_Pending(request, answer, uid, self.state.version, self.clock()))
            return
        self._answer(request, answer, uid)
        if request.command == "stop" and answer.ok:
            self.stop()

    def _answer(self, request: CtlRequest, answer: CtlAnswer, uid: int) -> None:
        save(self.paths.answer(request.id), answer)
        with contextlib.suppress(OSError):
            log_command(self.paths, request, answer, uid)

    def _settle(self) -> None:
        if not self.pending:
            return
        reports = [r for r in follower_reports(self.paths) if not r.ended]
        for item in list(self.pending):
            behind = sum(1 for r in reports if r.version < item.version)
            waited = self.clock() - item.since
            if behind and waited < ACK_WAIT_S:
                continue
            if behind:
                item.answer.message += f" (not yet applied by {behind} of {len(reports)} processes)"
            self.pending.remove(item)
            self._answer(item.request, item.answer, item.uid)

    # ----- the commands ------------------------------------------------------------------------------------
    def _handle(self, request: CtlRequest) -> CtlAnswer:
        command, args = request.command, request.args
        if command not in COMMANDS:
            raise Refused(f"unknown command {command!r}: one of {', '.join(COMMANDS)}")
        if command in ("status", "pause", "resume", "drain", "stop") and args:
            raise Refused(f"{command} takes no arguments")
        if command == "status":
            return CtlAnswer(request.id, True, self._status_line(), self._status())
        if command == "stop":
            return CtlAnswer(
                request.id, True, "stopping as Ctrl-C does: running tasks are cancelled, finished ones kept"
            )
        if command == "set":
            return CtlAnswer(request.id, True, self._set(args))
        if command == "requeue":
            return CtlAnswer(request.id, True, self._requeue(args))
        wanted = {"pause": ("paused", True), "resume": ("paused", False), "drain": ("draining", True)}[command]
        if getattr(self.state, wanted[0]) != wanted[1]:
            setattr(self.state, wanted[0], wanted[1])
            self.state.version += 1
        said = {
            "pause": "paused: no new turn starts; model calls already sent finish",
            "resume": "resumed: turns start again",
            "drain": "draining: no new task starts; running tasks finish, then the run ends",
        }
        return CtlAnswer(request.id, True, said[command])

    def _set(self, args: list[str]) -> str:
        can = f"the settings that can change while the run runs: {', '.join(SETTABLE)}"
        if len(args) != 1 or "=" not in args[0]:
            raise Refused(f"set takes one KEY=VALUE; {can}")
        key, _, raw = args[0].partition("=")
        key, raw = key.strip(), raw.strip()
        if key not in SETTABLE:
            raise Refused(f"{key} cannot change while the run runs; {can}")
        if key == "experiment.max_concurrent":
            low = max(1, self.workers)
            if not raw.isdigit() or not low <= int(raw) <= MAX_CONCURRENT:
                raise Refused(f"{key} must be a whole number from {low} to {MAX_CONCURRENT}, not {raw!r}; {can}")
            self.state.max_concurrent = int(raw)
        else:
            try:
                cost = float(raw)
            except ValueError:
                cost = math.nan
            if not (math.isfinite(cost) and cost > 0):
                raise Refused(f"{key} must be a positive number of dollars, not {raw!r}; {can}")
            self.state.cost_usd = cost
        self.state.version += 1
        if key == "experiment.budget.cost_usd" and self.shared_budget:
            return (
                f"{key} = {raw} for this run: the runs sharing its budget (experiment.coordination) each stop at "
                "their own cap; set it in each of them"
            )
        return f"{key} = {raw}"

    def _requeue(self, args: list[str]) -> str:
        if len(args) != 1:
            raise Refused("requeue takes one task id")
        task_id = args[0]
        why = self.failed(task_id)
        if why is not None:
            raise Refused(f"cannot requeue {task_id}: {why}")
        since = self._requeued.get(task_id)
        if since is not None and since >= self._result_time(task_id):
            raise Refused(f"cannot requeue {task_id}: it is queued already")
        self._requeued[task_id] = time.time()
        self.state.requeue.append(task_id)
        self.state.version += 1
        return f"requeued {task_id}: it runs again after the tasks waiting now"

    def _result_time(self, task_id: str) -> float:
        with contextlib.suppress(OSError):
            return RunLayout(self.run_dir).result(task_id).stat().st_mtime
        return 0.0

    def _status(self) -> dict[str, Any]:
        reports = follower_reports(self.paths)
        data = {
            "state": asdict(self.state),
            "running": sum(r.running for r in reports),
            "waiting_at_turn": sum(r.waiting for r in reports),
            "workers": self.workers,
        }
        data.update(self.status())
        return data

    def _status_line(self) -> str:
        data = self._status()
        state = self.state
        mode = "paused" if state.paused else "draining" if state.draining else "running"
        parts = [mode, f"tasks {data.get('done', '?')}/{data.get('total', '?')} done", f"{data['running']} running"]
        if state.paused:
            parts.append(f"{data['waiting_at_turn']} waiting at a turn's start")
        if data.get("concurrency"):
            parts.append(f"max_concurrent {data['concurrency']}")
        if state.cost_usd is not None:
            parts.append(f"budget ${state.cost_usd:g}")
        return ", ".join(parts)
