"""Resume inside a task: a rerun continues an unfinished task from its own saved turns, paying none of them again.

A task that has no finished result when a rerun reaches it (killed mid-task, failed, stopped by the budget) is
no longer started over from turn 1. Its turn folders are moved aside into ``<run>/.resume`` (laid out as a run
folder: ``RunLayout.resume``), and the task runs again with its saved turns in front of the provider:

* each model call whose request equals the request saved for the same (task, epoch, conversation, turn) is
  answered with the saved reply, as a fork replays its prefix: nothing is sent, nothing is billed (the ledger
  already holds that call, paid by the session that made it, also when that session died before the turn's
  tools finished);
* everything else runs for real: the prefix's tool calls run again in the task's fresh workspace (tool state is
  restored the way a fork restores it), and every node's output is compared with the saved one (``ResumeAudit``,
  the replay audit's comparison); a different output changes the next request, which then goes live;
* at the first call without a saved reply, or whose request differs, the task goes live and stays live.

``result.json`` says how many turns were resumed (``resumed_turns``, every conversation's calls answered from the
saved turns) and where a resumed node differed (``resume_divergence``). When the task's result is written the
moved-aside turns are dropped: the task folder holds them again. A rerun killed in its turn replays the merge
of both: a turn the newer session saved a reply for replaces the older one. Each attempt of pass@k resumes
from its own saved turns (the store keeps them as the task folder does, ``attempts/<n>``, and puts the running
attempt's in place), so a task killed in its third attempt pays none of its first two again. A settings change is
refused before anything runs by the fingerprint rule (flowllm/setup/fingerprint.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from flowllm.core.forwarding import ProviderFacade
from flowllm.core.interfaces import CallContext, Provider
from flowllm.core.types import Block, Message, ModelResponse, ToolSpec
from flowllm.engine import BoundNode, TurnContext
from flowllm.engine.runners import NodeObserver
from flowllm.providers.fork import ForkProvider
from flowllm.providers.replay import CALL_NODE, read_saved
from flowllm.run.replay_audit import ReplayAudit
from flowllm.rundir.epochs import current_epoch
from flowllm.rundir.layout import (
    ATTEMPTS_DIR,
    DIGESTS_FILE,
    LEGACY_AGENTS_DIR,
    OUTPUT_FILE,
    RESULT_FILE,
    STATE_FILE,
    TIMING_FILE,
    TURN_GLOB,
    WORKSPACE_DIR,
    RunLayout,
    nested_origin,
    turn_folder,
)
from flowllm.rundir.records import held_exchange_of

__all__ = ["ResumeAudit", "ResumeStore", "ResumingProvider", "TaskResume", "clear_epoch_dir", "clear_task_dir"]

_CALL_OUTPUT = f"*_{CALL_NODE}/{OUTPUT_FILE}"
ACTIVE_FILE = ".attempt"  # in a task's store folder: which attempt's turns are in place (pass@k)


def _has_reply(turn: Path) -> bool:
    return any(turn.glob(_CALL_OUTPUT))


def _attempt_numbers(folder: Path) -> list[int]:
    """The attempts a task folder's ``attempts/`` holds (pass@k's finished ones)."""
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def _move_turns(turns: list[Path], target: Path) -> None:
    """Move turn folders into ``target``; a turn it holds already is replaced only by one that saved a reply."""
    if not turns:
        return
    target.mkdir(parents=True, exist_ok=True)
    for turn in turns:
        kept = target / turn.name
        if kept.exists():
            if not _has_reply(turn):
                continue
            shutil.rmtree(kept)
        shutil.move(str(turn), str(kept))


@dataclass(frozen=True)
class SavedReply:
    request: dict[str, Any] | None
    response: dict[str, Any]


class ResumeStore:
    """The saved turns of the tasks being resumed, under ``<run>/.resume`` (one folder per task and epoch)."""

    def __init__(self, run_dir: Path) -> None:
        self.layout = RunLayout(run_dir).resume

    def shelve(self, records: Path, task_id: str, epoch: int | None) -> None:
        """Move the turn folders of ``records`` (a task's or an epoch's folder) aside; a turn the store holds
        already is replaced only when the newer one saved a reply. A task of one attempt keeps its turns in the
        store's task folder; a task of several (pass@k) keeps each attempt's in ``attempts/<n>``, the attempt
        that was running when the run stopped included."""
        turns = sorted(records.glob(TURN_GLOB))
        attempts = _attempt_numbers(records / ATTEMPTS_DIR)
        if not turns and not attempts:
            return
        target = self.layout.records(task_id, epoch)
        self._settle(target)
        kept = target / ATTEMPTS_DIR
        if not attempts and not kept.is_dir():
            _move_turns(turns, target)
            return
        _move_turns(sorted(target.glob(TURN_GLOB)), kept / "1")  # an earlier session's first attempt, in place
        for number in attempts:
            _move_turns(sorted((records / ATTEMPTS_DIR / str(number)).glob(TURN_GLOB)), kept / str(number))
        _move_turns(turns, kept / str(max(attempts, default=0) + 1))

    def activate(self, task_id: str, epoch: int | None, attempt: int) -> bool:
        """Put attempt ``attempt``'s saved turns in place, where the provider and the audit read them; False when
        the store holds none for it."""
        target = self.layout.records(task_id, epoch)
        kept = target / ATTEMPTS_DIR
        if not kept.is_dir():  # one attempt's turns, the first's
            return attempt == 1
        self._settle(target)
        saved = sorted((kept / str(attempt)).glob(TURN_GLOB))
        _move_turns(saved, target)
        (target / ACTIVE_FILE).write_text(str(attempt), encoding="ascii")
        return bool(saved)

    def _settle(self, target: Path) -> None:
        """The attempt in place (``activate``) goes back to its own folder."""
        marker = target / ACTIVE_FILE
        try:
            number = int(marker.read_text(encoding="ascii"))
        except (OSError, ValueError):
            return
        _move_turns(sorted(target.glob(TURN_GLOB)), target / ATTEMPTS_DIR / str(number))
        marker.unlink()

    def holds(self, task_id: str, epoch: int | None) -> bool:
        return self.layout.turn(task_id, 1, "", epoch).is_dir()

    def drop(self, task_id: str, epoch: int | None) -> None:
        """The task's (or epoch's) result is written: its folder holds every turn again."""
        folder = self.layout.records(task_id, epoch)
        shutil.rmtree(folder, ignore_errors=True)
        for parent in folder.parents:  # the empty folders above, up to and with .resume itself
            if parent == self.layout.root.parent:
                break
            with contextlib.suppress(OSError):
                parent.rmdir()

    def saved(self, context: CallContext, epoch: int | None) -> SavedReply | None:
        """The saved reply of a call, and the request it answered; None when the turn has none."""
        turn = self.layout.conversation(context.task_id, context.scope, epoch) / turn_folder(context.turn)
        try:
            with os.scandir(turn) as entries:
                names = [e.name for e in entries if e.name.endswith(f"_{CALL_NODE}") and e.is_dir()]
        except OSError:
            return _held_in(self, context, epoch)
        if len(names) != 1:
            return None
        try:
            value = orjson.loads(read_saved(str(turn / names[0] / OUTPUT_FILE)))
        except (OSError, orjson.JSONDecodeError):
            return None
        raw = value.get("raw_response") if isinstance(value, dict) else None
        if not isinstance(raw, dict):
            return None
        request = value.get("raw_request")
        return SavedReply(request if isinstance(request, dict) else None, raw)


def _held_in(store: ResumeStore, context: CallContext, epoch: int | None) -> SavedReply | None:
    """A one-call conversation's saved exchange (compaction's summary: ``nested_scope``), which the node that made
    it holds in its output in the turn it was made in; None when ``context`` is no such call or none is saved."""
    origin = nested_origin(context.scope) if context.turn == 1 else None
    if origin is None:
        return None
    scope, turn = origin
    held = held_exchange_of(store.layout.conversation(context.task_id, scope, epoch) / turn_folder(turn))
    return SavedReply(held[0], held[1]) if held is not None else None


@dataclass
class Resumed:
    """One task (or epoch) being resumed: the calls its saved turns answered, and where it went live."""

    served: int = 0
    live_at: int | None = None


class ResumingProvider(ProviderFacade):
    """In front of the run's provider: a resumed task's calls are answered from its saved turns while they ask
    what was asked then; the first that does not goes to ``inner``, and so does every later call of the task."""

    def __init__(self, inner: Provider, store: ResumeStore) -> None:
        self.inner = inner
        self.adopt(inner)
        self.store = store
        self._tasks: dict[tuple[str, int | None], Resumed] = {}
        self._lock = threading.Lock()

    def build_request(self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        return self.inner.build_request(system=system, messages=messages, tools=tools)

    def normalize(self, raw: dict[str, Any]) -> ModelResponse:
        return self.inner.normalize(raw)

    def begin(self, task_id: str, attempt: int = 1) -> None:
        """Attempt ``attempt`` of ``task_id`` (in the running epoch) resumes when the store holds its turns."""
        epoch = current_epoch()
        if self.store.activate(task_id, epoch, attempt) and self.store.holds(task_id, epoch):
            with self._lock:
                self._tasks[(task_id, epoch)] = Resumed()

    def end(self, task_id: str) -> Resumed | None:
        with self._lock:
            return self._tasks.pop((task_id, current_epoch()), None)

    def replaying(self, task_id: str) -> bool:
        """Whether the task's calls are still answered from its saved turns."""
        with self._lock:
            state = self._tasks.get((task_id, current_epoch()))
        return state is not None and state.live_at is None

    async def send(self, request: dict[str, Any], *, context: CallContext) -> dict[str, Any]:
        epoch = current_epoch()
        with self._lock:
            state = self._tasks.get((context.task_id, epoch))
        if state is not None and state.live_at is None:
            saved = self.store.saved(context, epoch)
            if saved is not None and saved.request is not None and saved.request == request:
                with self._lock:
                    state.served += 1
                if isinstance(self.inner, ForkProvider):  # a live reply of a fork: its fork log learns it again
                    self.inner.resumed_reply(request, saved.response, context)
                return saved.response
            with self._lock:
                state.live_at = context.turn
        return await self.inner.send(request, context=context)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __repr__(self) -> str:
        return f"ResumingProvider({self.inner!r})"


class ResumeAudit(ReplayAudit):
    """The replay audit of the resumed turns: a node of a task still answered from its saved turns is compared
    with the saved node; every node goes on to the recorder (``recorder``) as usual."""

    def __init__(
        self, provider: ResumingProvider, dumps: Callable[[Any], bytes], recorder: NodeObserver | None
    ) -> None:
        super().__init__(provider.store.layout, dumps, recorder)
        self.provider = provider

    @property
    def records_nodes(self) -> bool:  # type: ignore[override]
        """As the observer behind it: a recorder that keeps no node (snapshot=none) saved no turn to resume from."""
        return self.recorder is not None and self.recorder.records_nodes

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None:
        if self.provider.replaying(ctx.task_id):
            super().on_node(ctx, node, inputs, outputs, meta)
        elif self._forward:
            assert self.recorder is not None
            self.recorder.on_node(ctx, node, inputs, outputs, meta)

    def divergence(self, task_id: str) -> dict[str, Any] | None:
        """The first resumed node whose output differed from the saved one (None: none did)."""
        with self._lock:
            first = self._first.get(task_id)
        return None if first is None else first.to_dict()


def clear_task_dir(layout: RunLayout, task_id: str, epochs: int, store: ResumeStore | None) -> None:
    """A (re)run of a task starts from a clean folder: nothing of an interrupted or failed earlier run is left to
    be counted. Its turns are moved into ``store`` first (when the rerun resumes tasks)."""
    task_dir = layout.task(task_id)
    if not task_dir.exists():  # a new run's task (or a new task): nothing of an earlier run to clear
        return
    if store is not None and epochs == 1:
        store.shelve(task_dir, task_id, None)
    stale_dirs = (task_dir / WORKSPACE_DIR, task_dir / ATTEMPTS_DIR, task_dir / LEGACY_AGENTS_DIR)
    for stale in (*task_dir.glob(TURN_GLOB), *stale_dirs):
        shutil.rmtree(stale, ignore_errors=True)
    for partial in task_dir.glob(".*.tmp"):  # half-written files of a process killed mid-write
        partial.unlink(missing_ok=True)
    (task_dir / RESULT_FILE).unlink(missing_ok=True)
    (task_dir / TIMING_FILE).unlink(missing_ok=True)
    (task_dir / DIGESTS_FILE).unlink(missing_ok=True)
    (task_dir / STATE_FILE).unlink(missing_ok=True)
    # Epochs beyond this run's number (all of them without epochs) are not this run's: an earlier run's.
    epochs_dir = layout.epochs(task_id)
    if epochs == 1:
        shutil.rmtree(epochs_dir, ignore_errors=True)
    for folder in epochs_dir.glob("*") if epochs_dir.is_dir() else ():
        if not folder.name.isdigit() or int(folder.name) > epochs:
            shutil.rmtree(folder, ignore_errors=True)


def clear_epoch_dir(folder: Path, task_id: str, epoch: int, store: ResumeStore | None) -> None:
    """An epoch that runs (again) starts from an empty folder; its turns are moved into ``store`` first."""
    if store is not None:
        store.shelve(folder, task_id, epoch)
    shutil.rmtree(folder, ignore_errors=True)


@dataclass
class TaskResume:
    """What the experiment holds to resume tasks: the store, the provider in front of the run's, the audit."""

    store: ResumeStore
    provider: ResumingProvider
    audit: ResumeAudit

    @classmethod
    def open(
        cls, run_dir: Path, provider: Provider, observer: NodeObserver | None, dumps: Callable[[Any], bytes]
    ) -> TaskResume:
        store = ResumeStore(run_dir)
        resuming = ResumingProvider(provider, store)
        return cls(store, resuming, ResumeAudit(resuming, dumps, observer))

    def begin(self, task_id: str, attempt: int) -> None:
        self.audit.forget(task_id)
        self.provider.begin(task_id, attempt)

    def end(self, task_id: str) -> tuple[int, dict[str, Any] | None]:
        """How many calls the saved turns answered, and the first resumed node that differed."""
        state = self.provider.end(task_id)
        if state is None:
            return 0, None
        return state.served, self.audit.divergence(task_id)
