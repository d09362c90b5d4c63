"""The replay provider: a saved run's model replies, served again, so the rest of the pipeline can change.

    python -m flowllm provider=replay provider.run_dir=runs/2026-12-02/08-49-59 repair=strict

Each ``send`` is keyed by the ``CallContext`` (task, agent, turn) and answers with the ``raw_response`` that
the old run's ``call_model`` node saved for that turn, byte for byte. Everything after ``call_model`` runs for
real (normalize, parsing, repair, tools), so a changed parser or repair chain re-scores the whole run without
calling any API.

The replies are read with the protocol that produced them: the old run's ``.hydra/config.yaml`` names its
provider config, and that protocol's provider is built with an SDK client that is never used (so no network,
no key). Its ``build_request`` also builds the new requests, which keeps the new run's ``raw_request``
comparable with the old one.

What replay cannot do is invent a reply. When the new pipeline asks for a turn the old run never made (a
changed parser saw a tool call the old one missed, or a task the old run did not have), ``send`` raises
``ReplayMissError`` naming the task and the turn; the experiment records that task as failed and goes on
with the others. When the request differs from the saved one (the conversation changed earlier: a repaired
argument gave another tool result) the saved reply is still served, and the first difference is logged once
per task, because the reply was written for the old conversation.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flowllm.config.provider_schema import ProviderConfig
from flowllm.config.providers import provider_config
from flowllm.config.saved import saved_cwd, saved_section
from flowllm.core.forwarding import ProviderFacade
from flowllm.core.interfaces import CallContext
from flowllm.core.types import Block, Message, ModelResponse, ToolSpec
from flowllm.errors import CliError, ConfigError
from flowllm.providers.base import BaseProvider
from flowllm.providers.errors import ProviderConfigError, ProviderError
from flowllm.providers.factory import build_provider
from flowllm.rundir.epochs import current_epoch
from flowllm.rundir.jsondiff import first_difference
from flowllm.rundir.layout import MAIN_AGENT, NODE_RE, OUTPUT_FILE, RunLayout, TurnDirs, nested_origin
from flowllm.rundir.records import NodeRecord, TurnRecord, held_exchange_of, read_turns
from flowllm.rundir.store import local_run

log = logging.getLogger(__name__)

REPLAY_PROTOCOL = "replay"
CALL_NODE = "call_model"
# A replay of a replay points at another run; more than a few hops means a loop in the run_dir settings.
MAX_CHAIN = 16
# The SDK client of the inner provider is never used; if it ever were, it would hit a closed local port
# rather than a real API.
UNUSED_BASE_URL = "http://127.0.0.1:9"
# Saved records are read in pieces of this size: one read for nearly all of them.
READ_CHUNK = 1 << 16
# How many saved call outputs ``send`` keeps for the replay audit at most: one per conversation in flight is used
# (and taken); the rest are left by calls whose node then failed, and are dropped when the limit is reached.
KEPT_OUTPUTS = 256
# A node's record in a saved run: (task id, scope, epoch, turn, the node's folder name ``NN_name``).
SavedKey = tuple[str, str, int | None, int, str]


class ReplayMissError(ProviderError):
    """The new pipeline asked for a model call the replayed run cannot answer."""

    def __init__(self, message: str, *, task_id: str, turn: int, agent: str = MAIN_AGENT) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.turn = turn
        self.agent = agent


@dataclass(frozen=True)
class SavedCall:
    """What the old run's call_model node recorded for one turn; ``folder`` is its node folder."""

    raw_request: dict[str, Any] | None
    raw_response: dict[str, Any]
    folder: str

    @property
    def path(self) -> Path:
        return Path(self.folder)


def read_saved(path: str) -> bytes:
    """A saved record's bytes (``Path(path).read_bytes()``, with fewer calls: replay reads one per node); raises
    ``OSError`` as it does."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        chunk = os.read(fd, READ_CHUNK)
        if len(chunk) < READ_CHUNK:  # a regular file's short read is its end: no second read to learn it
            return chunk
        chunks = [chunk]
        while chunk := os.read(fd, READ_CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def resolve_run_dir(value: str | Path) -> Path:
    """``provider.run_dir`` as given: runs are written relative to the working directory (``hydra.run.dir``); a
    store's URL (``experiment.store``) is read from its local copy (flowllm/rundir/store.py)."""
    try:
        return local_run(value)
    except CliError as exc:  # a store that cannot be read: nothing can run (exit 2)
        raise ProviderConfigError(f"provider.run_dir: {exc}") from None


def saved_run_dir(run_dir: Path, value: str) -> Path:
    """The run folder ``run_dir``'s saved config names (its ``provider.run_dir``): a relative path is relative to
    the folder that run was started in, when the run is there; else to this process's (as typed)."""
    found = resolve_run_dir(value)
    started = None if found.is_absolute() else saved_cwd(RunLayout(run_dir).hydra)
    if started is not None and (started / found).is_dir():
        return started / found
    return found


def _saved_provider_config(run_dir: Path) -> dict[str, Any]:
    """The ``provider`` section of a run's saved config, with interpolations resolved against that config."""
    config_path = RunLayout(run_dir).config
    if not config_path.is_file():
        raise ProviderConfigError(
            f"provider.run_dir: {run_dir} has no .hydra/config.yaml, so the protocol that produced its replies "
            "is unknown (only runs made by `python -m flowllm` can be replayed)"
        )
    try:
        provider = saved_section(config_path, "provider")
    except ConfigError as exc:
        raise ProviderConfigError(f"provider.run_dir: {exc}") from None
    if not isinstance(provider, dict):
        raise ProviderConfigError(f"provider.run_dir: {config_path} has no provider section")
    return provider


def _kept_origin(run_dir: Path) -> dict[str, Any] | None:
    """The origin's provider section a bundled replay keeps (``REPLAYED_PROVIDER_FILE``); None when it has none."""
    path = RunLayout(run_dir).replayed_provider
    if not path.is_file():
        return None
    try:
        kept = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ProviderConfigError(f"provider.run_dir: {path} cannot be read: {exc}") from None
    if not isinstance(kept, dict) or kept.get("protocol") in (None, REPLAY_PROTOCOL):
        raise ProviderConfigError(f"provider.run_dir: {path} names no provider that made replies")
    return kept


def origin_provider_section(run_dir: Path) -> tuple[dict[str, Any], list[Path]]:
    """The ``provider`` section of the run that made ``run_dir``'s replies, following replays of replays to it (or
    read where a bundled replay keeps it), and the chain of run folders visited (the first is ``run_dir``)."""
    chain = [run_dir]
    while True:
        raw = _kept_origin(chain[-1]) or _saved_provider_config(chain[-1])
        if raw.get("protocol") != REPLAY_PROTOCOL:
            return raw, chain
        if not raw.get("run_dir"):
            raise ProviderConfigError(f"{chain[-1]} is a replay run whose provider.run_dir is not recorded")
        nxt = saved_run_dir(chain[-1], str(raw["run_dir"]))
        if nxt in chain or len(chain) >= MAX_CHAIN:
            raise ProviderConfigError(
                f"provider.run_dir: the replay chain loops ({' -> '.join(str(p) for p in [*chain, nxt])})"
            )
        chain.append(nxt)


def source_provider_config(run_dir: Path) -> tuple[ProviderConfig, list[Path]]:
    """The provider config that produced ``run_dir``'s replies (``origin_provider_section``), and the chain."""
    raw, chain = origin_provider_section(run_dir)
    # emulator_script and keys do not matter here: only build_request and normalize will be used.
    raw = {**raw, "emulator_script": None, "run_dir": None}
    try:
        return provider_config(raw), chain
    except ConfigError as exc:
        raise ProviderConfigError(f"provider.run_dir: {chain[-1]}: {exc}") from None


@dataclass
class _TaskIndex:
    turns: dict[int, TurnRecord]
    notes: list[str] = field(default_factory=list)


class ReplayProvider(ProviderFacade):
    """Serves saved replies by (task, agent, turn); builds requests and normalizes with the source protocol,
    whose capabilities (``accepted_media`` included) it declares as its own."""

    def __init__(self, cfg: ProviderConfig, run_dir: Path, inner: BaseProvider) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.layout = RunLayout(run_dir)
        self._turn_dirs = TurnDirs(self.layout)  # each turn's folder spelled once (the audit reads it per node)
        self.inner = inner
        self.adopt(inner, name=cfg.name)
        self.served = 0
        self.diverged: dict[str, str] = {}  # "task[/agent]" -> where its first request differed
        self._index: dict[tuple[str, str, int | None], _TaskIndex] = {}
        self._lock = threading.Lock()
        # The output.json bytes each send read, by the node they belong to (``SavedKey``), until the replay audit
        # takes them (``output_taker``); kept only once an audit asked for them.
        self._outputs: dict[SavedKey, bytes] = {}
        self._keep_outputs = False
        # The call node's folder name (``NN_call_model``) last found by a scan: every turn of a pipeline has the
        # same one, so the next turn opens it without scanning its folder first.
        self._call_folder: str | None = None

    # ----- pure halves: the source protocol's ------------------------------------------------------------
    def build_request(self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        return self.inner.build_request(system=system, messages=messages, tools=tools)

    def normalize(self, raw: dict[str, Any]) -> ModelResponse:
        return self.inner.normalize(raw)

    # ----- the saved replies -----------------------------------------------------------------------------
    def _turns(self, task_id: str, scope: str) -> _TaskIndex:
        """The saved turns of one conversation: the task's own (scope "") or a sub-agent call's."""
        epoch = current_epoch()  # an epochs run replays each epoch from its own folder
        key = (task_id, scope, epoch)
        with self._lock:
            index = self._index.get(key)
        if index is not None:
            return index
        turns, notes = read_turns(self.layout.conversation(task_id, scope, epoch))
        index = _TaskIndex({t.number: t for t in turns}, notes)
        with self._lock:
            self._index[key] = index
        return index

    @staticmethod
    def _call_node(turn: TurnRecord) -> NodeRecord | None:
        named = [n for n in turn.nodes if n.name == CALL_NODE]
        if named:
            return named[0]
        # A pipeline may name the node differently: the one whose output holds a raw_response is it.
        for node in turn.nodes:
            out = node.output()
            if out.ok and isinstance(out.value, dict) and "raw_response" in out.value:
                return node
        return None

    def _direct_call(self, context: CallContext) -> SavedCall | None:
        """The fast path: ``turn_NNN/<NN>_call_model/output.json`` of this conversation, read once: at the name the
        previous turn's was found at, else found with one directory scan.

        None when the layout is anything else (an older run, a renamed node, a missing turn) or the record does
        not hold a reply: ``saved_call`` then indexes the conversation's folders and explains what it finds.
        """
        epoch = current_epoch()
        turn_dir = self._turn_dirs.turn(context.task_id, context.turn, context.scope, epoch)
        data: bytes | None = None
        name = self._call_folder or ""  # the name of the previous turn's call folder: no scan when it is there
        if name:
            folder = f"{turn_dir}{os.sep}{name}"
            with contextlib.suppress(OSError):
                data = read_saved(f"{folder}{os.sep}{OUTPUT_FILE}")
        if data is None:
            suffix = f"_{CALL_NODE}"
            try:
                with os.scandir(turn_dir) as entries:
                    names = [e.name for e in entries if e.name.endswith(suffix) and e.is_dir()]
            except OSError:
                return None
            if len(names) != 1 or NODE_RE.match(names[0]) is None:
                return None
            name = names[0]
            folder = f"{turn_dir}{os.sep}{name}"
            try:
                data = read_saved(f"{folder}{os.sep}{OUTPUT_FILE}")
            except OSError:
                return None
            self._call_folder = name
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        raw = value.get("raw_response") if isinstance(value, dict) else None
        if not isinstance(raw, dict):
            return None
        request = value.get("raw_request")
        if self._keep_outputs:
            if len(self._outputs) >= KEPT_OUTPUTS:
                self._outputs.clear()
            self._outputs[(context.task_id, context.scope, epoch, context.turn, name)] = data
        return SavedCall(request if isinstance(request, dict) else None, raw, folder)

    def output_taker(self) -> Callable[[SavedKey], bytes | None]:
        """From now on keep the saved call outputs ``send`` reads, for the replay audit (``ReplayAudit``'s
        ``saved_outputs``), so that it need not read the call node's record again; returns ``saved_output``."""
        self._keep_outputs = True
        return self.saved_output

    def saved_output(self, key: SavedKey) -> bytes | None:
        """The bytes of the saved ``output.json`` of the node ``key`` names that a ``send`` read since
        ``output_taker`` was called, given once; None when no send read it (or it was given already)."""
        return self._outputs.pop(key, None)

    def _nested_call(self, context: CallContext) -> SavedCall | None:
        """The exchange of a one-call conversation of its own (compaction's summary: ``nested_scope``), which the
        node that made it recorded in its output (a port holding ``raw_request`` and ``raw_response``), not as a
        conversation of turns; None when ``context`` is not such a call or no node of its turn holds one."""
        origin = nested_origin(context.scope) if context.turn == 1 else None
        if origin is None:
            return None
        parent_scope, parent_turn = origin
        turn = self._turns(context.task_id, parent_scope).turns.get(parent_turn)
        held = held_exchange_of(turn.path) if turn is not None else None
        return SavedCall(held[0], held[1], str(held[2])) if held is not None else None

    def saved_call(self, context: CallContext) -> SavedCall:
        """The saved exchange for ``context``; raises ``ReplayMissError`` saying why there is none."""
        task, turn_no, agent = context.task_id, context.turn, context.agent
        direct = self._direct_call(context)
        if direct is not None:
            return direct
        who = f"task '{task}'" + (f" (sub-agent '{agent}')" if agent != MAIN_AGENT else "")
        epoch = current_epoch()
        task_dir = self.layout.records(task, epoch)
        if not task_dir.is_dir():
            such = "no such task" if epoch is None else f"no epoch {epoch} of this task"
            raise ReplayMissError(
                f"replay: {who} turn {turn_no}: the replayed run {self.run_dir} has {such}",
                task_id=task,
                turn=turn_no,
                agent=agent,
            )
        index = self._turns(task, context.scope)
        turn = index.turns.get(turn_no)
        nested = self._nested_call(context) if turn is None else None
        if nested is not None:
            return nested
        if turn is None:
            made = sorted(index.turns)
            what = f"it made turns {made[0]}-{made[-1]}" if made else "it recorded no turns for it"
            raise ReplayMissError(
                f"replay: {who} turn {turn_no}: the replayed run never made this turn ({what}); the new "
                "pipeline took another path earlier (a parser or repair change can add a turn)",
                task_id=task,
                turn=turn_no,
                agent=agent,
            )
        node = self._call_node(turn)
        if node is None:
            raise ReplayMissError(
                f"replay: {who} turn {turn_no}: no {CALL_NODE} record in {turn.path}",
                task_id=task,
                turn=turn_no,
                agent=agent,
            )
        output = node.output()
        if not output.ok:
            if output.missing and node.status == "error":
                reason = f"the original call failed: {node.error}"
            elif output.missing:
                reason = "its output.json is missing (recorder.snapshot=errors or none keeps no reply)"
            else:
                reason = output.error or "its output.json is unreadable"
            raise ReplayMissError(
                f"replay: {who} turn {turn_no}: cannot serve {node.folder}: {reason}",
                task_id=task,
                turn=turn_no,
                agent=agent,
            )
        value = output.value
        raw = value.get("raw_response") if isinstance(value, dict) else None
        if not isinstance(raw, dict):
            raise ReplayMissError(
                f"replay: {who} turn {turn_no}: {node.path / OUTPUT_FILE} holds no raw_response",
                task_id=task,
                turn=turn_no,
                agent=agent,
            )
        request = value.get("raw_request")
        return SavedCall(request if isinstance(request, dict) else None, raw, str(node.path))

    async def send(self, request: dict[str, Any], *, context: CallContext) -> dict[str, Any]:
        # File reads are small and local (one output.json); no thread hop needed.
        saved = self.saved_call(context)
        # Plain equality first (C speed): the walk that finds where two requests differ runs only when they do.
        if saved.raw_request is not None and saved.raw_request != request:
            diff = first_difference(saved.raw_request, request)
            if diff is not None:
                key = context.task_id + (f"/{context.scope}" if context.scope else "")
                with self._lock:
                    first = key not in self.diverged
                    if first:
                        self.diverged[key] = f"turn {context.turn}: {diff.describe(160)}"
                if first:
                    log.warning(
                        "replay: task %s turn %d: the request differs from the saved one (%s); serving the saved "
                        "reply, which was written for the old conversation",
                        key,
                        context.turn,
                        diff.describe(160),
                    )
        with self._lock:
            self.served += 1
        return saved.raw_response

    async def aclose(self) -> None:
        if self.diverged:
            log.info(
                "replay: served %d saved replies from %s; %d task(s) asked with a changed conversation: %s",
                self.served,
                self.run_dir,
                len(self.diverged),
                ", ".join(sorted(self.diverged)),
            )
        await self.inner.aclose()

    def __repr__(self) -> str:
        return f"ReplayProvider(run_dir={str(self.run_dir)!r}, protocol={self.protocol!r}, model={self.model!r})"


def checked_run_dir(pcfg: ProviderConfig) -> Path:
    """``provider.run_dir``, checked to be a flowllm run; raises ``ProviderConfigError`` with what to do."""
    if not pcfg.run_dir:
        raise ProviderConfigError(
            "provider=replay needs the run to replay: add provider.run_dir=<run directory> (e.g. runs/<date>/<time>)"
        )
    run_dir = resolve_run_dir(pcfg.run_dir)
    if not run_dir.is_dir():
        raise ProviderConfigError(f"provider.run_dir: {run_dir} is not a directory")
    if not RunLayout(run_dir).tasks.is_dir():
        raise ProviderConfigError(
            f"provider.run_dir: {run_dir} is not a flowllm run (no tasks/ folder); for a multirun, pick one job "
            "folder (…/multirun/<date>/<time>/<job number>)"
        )
    return run_dir


def check_replay_epochs(pcfg: ProviderConfig, epochs: int) -> None:
    """A replay serves each epoch from the saved run's record of that epoch (``tasks/<id>/epochs/<n>/``, or the
    task's own folder in a run of one epoch): the saved run must have made the epochs asked for, except that a
    fork runs the epochs after the saved run's live. Raises ``ProviderConfigError`` with the setting to use."""
    if pcfg.protocol != REPLAY_PROTOCOL or not pcfg.run_dir:
        return
    try:
        found = saved_section(RunLayout(checked_run_dir(pcfg)).config, "experiment.epochs")
    except ConfigError as exc:
        raise ProviderConfigError(f"provider.run_dir: {exc}") from None
    saved = found if isinstance(found, int) and found >= 1 else 1  # a run made before epochs: one
    if (saved == 1) != (epochs == 1):
        raise ProviderConfigError(
            f"provider.run_dir: the saved run ran {saved} epoch{'s' if saved > 1 else ''}, this one {epochs}: a "
            f"replay serves each epoch from the saved run's record of it; set experiment.epochs={saved}"
        )
    if epochs > saved and pcfg.fork is None:
        raise ProviderConfigError(
            f"provider.run_dir: the saved run ran {saved} epochs and has no reply for epoch {saved + 1} or later: set "
            f"experiment.epochs={saved} or fewer, or fork (provider.fork=live) to run the later epochs live"
        )


def build_replay_provider(pcfg: ProviderConfig) -> ReplayProvider:
    """Check ``provider.run_dir`` and build the provider; raises ``ProviderConfigError`` with what to do."""
    run_dir = checked_run_dir(pcfg)
    source, _chain = source_provider_config(run_dir)
    try:
        inner = build_provider(source, base_url=UNUSED_BASE_URL)
    except ProviderConfigError as exc:
        raise ProviderConfigError(f"provider.run_dir: the replayed run's provider cannot be rebuilt: {exc}") from exc
    return ReplayProvider(pcfg, run_dir, inner)
