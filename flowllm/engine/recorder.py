"""The recorder: every node's input and output on disk, so any turn of any task can be read, replayed, diffed.

Layout under the run directory:

    tasks/<task_id>/turn_<NNN>/<NN>_<node>/input.json    what the node received
    tasks/<task_id>/turn_<NNN>/<NN>_<node>/output.json   what it produced (nothing run-specific)
    tasks/<task_id>/turn_<NNN>/<NN>_<node>/meta.json     start, duration, status, error and traceback
    tasks/<task_id>/turn_<NNN>/subagents/<name>-<call_id>/turn_<MMM>/...  a sub-agent's turns
    tasks/<task_id>/result.json
    blobs/<sha256>.<ext>                                  media, once per run (engine/blobs.py)
    summary.json

Serialisation (orjson) happens on the caller's thread, at once, so later mutation cannot change what was
recorded; file writes go to one background thread so the event loop never waits on the disk. The caller's
side is a few microseconds per node (serialise, append to a queue); the writer drains the queue in batches and
remembers which folders it made, so the disk, not Python, sets the pace (creating a file costs 100 us or more on
many disks). Writes keep their order (one FIFO writer), so a task's ``result.json`` lands after its node
records. Every file is written atomically (temp file in the same folder, then rename). Secrets never reach
disk: the values of the configured key variables and of every secret-named environment variable (``*_KEY``,
``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``) are masked wherever they appear, and any mapping key that names a
credential (``authorization``, ``x-api-key``, ``api_key``...) has its value masked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson

from flowllm.core.registry import Registry
from flowllm.engine.blobs import BlobStore
from flowllm.engine.context import TurnContext
from flowllm.engine.node import BoundNode
from flowllm.errors import RunError
from flowllm.rundir.digests import Digests, digest, node_key
from flowllm.rundir.epochs import current_epoch
from flowllm.rundir.layout import (
    DIGESTS_FILE,
    EPOCHS_DIR,
    INPUT_FILE,
    META_FILE,
    OUTPUT_FILE,
    RESULT_FILE,
    TIMING_FILE,
    RunLayout,
    turn_folder,
)
from flowllm.rundir.results import TaskResult
from flowllm.rundir.taskdirs import task_folder_name

SNAPSHOT_MODES: Registry[str] = Registry("recorder.snapshot", {m: m for m in ("all", "errors", "none")})
REDACTED = "[redacted]"
_SECRET_ENV_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$|SECRET|PRIVATE", re.I)
_SECRET_KEY = re.compile(r"^(authorization|proxy-authorization|x-api-key|api[-_]?key|.*_api_key|secret)$", re.I)


def _mentions_credential(data: bytes) -> bool:
    """Whether serialised JSON mentions authorization, api[-_]key or secret in any case.

    What a case-insensitive regex search answered, ~20x faster: it runs on every recorded file, and a regex
    scan of a few KB cost ~50 us where one lowercase copy and a few substring searches cost ~3 us.
    """
    low = data.lower()
    if b"authorization" in low or b"secret" in low:
        return True
    return b"key" in low and (b"api_key" in low or b"apikey" in low or b"api-key" in low)


_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, BaseException):
        return f"{type(obj).__name__}: {obj}"
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    return repr(obj)


def unmasked_record(value: Any) -> bytes:
    """How a record of ``value`` reads before secrets are masked and media moved to blobs (``Redactor.dumps``
    without the masking): when this equals a saved record byte for byte, so does the masked form."""
    return orjson.dumps(value, default=_default, option=_OPTIONS) + b"\n"


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of every environment variable whose name says it holds a secret (``*_KEY``, ``*TOKEN``...).

    The configured key variables are not the only ones a process holds: a provider SDK may read
    ``OPENAI_API_KEY`` on its own, and a tool may echo any of them. All are masked, not just the configured.
    """
    environ = os.environ if environ is None else environ
    return [value for name, value in environ.items() if _SECRET_ENV_NAME.search(name) and value]


class Redactor:
    """Masks secret values and credential-named fields in serialised JSON.

    The values masked are the ``secrets`` given (the configured key variables' values) and, unless
    ``environ`` is ``{}``, those of every secret-named variable in the environment (``environment_secrets``).
    """

    def __init__(self, secrets: Iterable[str] = (), *, environ: Mapping[str, str] | None = None) -> None:
        values = {*secrets, *environment_secrets(environ)}
        # Short values would mask innocent text; real keys are long.
        self.secrets = sorted({s for s in values if s and len(s) >= 8}, key=len, reverse=True)

    def mask(self, text: str | None) -> str | None:
        """``text`` with every secret value masked (for what is shown rather than written: the task table)."""
        if not text:
            return text
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {
                k: (REDACTED if isinstance(k, str) and _SECRET_KEY.match(k) else self._scrub(v))
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self._scrub(v) for v in value]
        return value

    def dumps(self, value: Any, *, scrub_fields: bool = True) -> bytes:
        """``value`` as indented JSON with secrets masked. ``scrub_fields=False`` skips the credential-field
        check, for payloads whose keys are known (a node's meta); secret values are masked either way."""
        data = orjson.dumps(value, default=_default, option=_OPTIONS)
        if scrub_fields and _mentions_credential(data):
            # Rare: only payloads that mention a credential field pay for the walk.
            data = orjson.dumps(self._scrub(orjson.loads(data)), option=_OPTIONS)
        for secret in self.secrets:
            encoded = secret.encode()
            if encoded in data:
                data = data.replace(encoded, REDACTED.encode())
        return data + b"\n"


class RecordError(RunError, OSError):
    """A run artifact could not be written (a full disk, a read-only folder): one line naming file and cause."""


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader (or a crash) sees the old file or the new one, never a part.

    Raises ``RecordError`` (one line) when the disk refuses; the old file, if any, is left as it was.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise RecordError(f"could not write {path}: {exc.strerror or exc}") from exc


log = logging.getLogger(__name__)

# One queued write: (folder, file name, bytes). A folder is a str: pathlib's joins cost microseconds per call.
_Write = tuple[str, str, bytes]


def _write_in(folder: str, name: str, data: bytes) -> None:
    """``atomic_write`` for the writer thread: os-level calls and no mkdir (the caller made the folder)."""
    tmp = f"{folder}/.{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, f"{folder}/{name}")


def _make_folder(folder: str) -> None:
    """``os.makedirs(folder, exist_ok=True)`` in one system call when the folder or its parent exists (a task's
    folder, a turn's): the writer thread gives up the interpreter lock at each call, and takes it back."""
    try:
        os.mkdir(folder)
    except FileExistsError:
        return
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)


def _settle_future(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled waiter's future is done already
        future.set_result(None)


class _Writer:
    """One background thread writing queued files in order; ``flush`` waits until the queue is on disk.

    A write that fails is logged once, as one line (a full disk fails every write after the first: a
    traceback each would bury the one line that matters), counted, and remembered per task folder so the
    runner can fail that task with the reason.
    """

    def __init__(self, tasks_root: str = "") -> None:
        # Files to write, a callback to call once everything queued before it is written, or None to stop.
        self._queue: queue.SimpleQueue[list[_Write] | Callable[[], None] | None] = queue.SimpleQueue()
        self._made: set[str] = set()  # folders this writer created or found (saves a mkdir per file)
        self._tasks_prefix = tasks_root.rstrip("/") + "/" if tasks_root else ""
        self.errors = 0
        self.first_error: str | None = None
        self.task_errors: dict[str, str] = {}  # task folder name -> the first write error met in it
        self._thread = threading.Thread(target=self._loop, name="flowllm-recorder", daemon=True)
        self._thread.start()

    def put(self, files: list[_Write]) -> None:
        self._queue.put(files)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if not isinstance(item, list):
                item()
                continue
            for folder, name, data in item:
                self._write(folder, name, data)

    def _write(self, folder: str, name: str, data: bytes) -> None:
        try:
            if folder not in self._made:
                _make_folder(folder)
                self._made.add(folder)
            try:
                _write_in(folder, name, data)
            except FileNotFoundError:
                # The folder was removed or moved since we made it (a task rerun, a shelved attempt): remake it.
                os.makedirs(folder, exist_ok=True)
                _write_in(folder, name, data)
        except OSError as exc:  # a failed artifact must not crash the writer; say it once and go on
            self._failed(folder, name, f"could not write {folder}/{name}: {exc.strerror or exc}")
        except Exception as exc:
            self._failed(folder, name, f"could not write {folder}/{name}: {type(exc).__name__}: {exc}")

    def _failed(self, folder: str, name: str, reason: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = reason
            log.error("recorder: %s (further write errors are counted, not shown)", reason)
        if self._tasks_prefix and folder.startswith(self._tasks_prefix):
            task = folder[len(self._tasks_prefix) :].split("/", 1)[0]
            self.task_errors.setdefault(task, reason)

    def flush(self) -> None:
        if not self._thread.is_alive():
            return
        done = threading.Event()
        self._queue.put(done.set)
        done.wait()

    async def flushed(self) -> None:
        """``flush`` for the event loop, with no thread of its own: the writer wakes the loop when it is done."""
        if not self._thread.is_alive():
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
                loop.call_soon_threadsafe(_settle_future, done)

        self._queue.put(wake)
        await done

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


class RunListener(Protocol):
    """Told what the recorder is told, whatever it keeps on disk (live telemetry): each node as it ends, each
    task's result, and the attempts that will be retried. It must not raise nor block."""

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None: ...

    def finish_task(self, task_id: str, result: TaskResult) -> None: ...

    def discard_task(self, task_id: str) -> None: ...


class Recorder:
    """Writes a run's artifacts. One instance per run; thread-safe; ``close()`` waits for pending writes."""

    def __init__(self, run_dir: Path | str, snapshot: str = "all", secrets: Iterable[str] = ()) -> None:
        SNAPSHOT_MODES.require(snapshot)
        self.run_dir = Path(run_dir)
        self.layout = RunLayout(self.run_dir)
        self._tasks_root = str(self.layout.tasks)
        self.snapshot = snapshot
        self.redactor = Redactor(secrets)
        self._writer = _Writer(self._tasks_root)
        # Media once per run, content-addressed (flowllm/engine/blobs.py); records hold references.
        self.blobs = BlobStore(self.run_dir, lambda folder, name, raw: self._writer.put([(folder, name, raw)]))
        self._closed = False
        self._lock = threading.Lock()
        # snapshot=errors keeps a task's node records in memory until we know whether the task failed.
        self._held: dict[str, list[_Write]] = {}
        # snapshot=all: the digest of each node output written so far, by records folder (a task's, an epoch's),
        # written as its digests.json when the run of the task or epoch ends (flowllm/rundir/digests.py).
        self._digests: dict[str, Digests] = {}
        self.listeners: list[RunListener] = []

    @property
    def writes_while_running(self) -> bool:
        """Whether a running task's node records go to disk as it runs (snapshot=all), so that they must have
        landed before its result is written; under errors they wait for the result, under none there are none."""
        return self.snapshot == "all"

    @property
    def records_nodes(self) -> bool:
        """False under snapshot=none (and no listener): the runners then skip timing and meta for nodes nobody
        records."""
        return self.snapshot != "none" or bool(self.listeners)

    @property
    def reads_meta(self) -> bool:
        """Whatever it records, it records with the node's meta (``meta.json``, the listeners' spans)."""
        return self.records_nodes

    @property
    def write_errors(self) -> int:
        """Files that could not be written so far (the first was logged with its path and cause)."""
        return self._writer.errors

    def task_write_error(self, task_id: str) -> str | None:
        """The first write that failed in a task's folder, after ``flush`` (``None``: all of them landed)."""
        return self._writer.task_errors.get(task_folder_name(task_id))

    def forget_task_errors(self, task_id: str) -> None:
        """A rerun of the task starts with a clean slate."""
        self._writer.task_errors.pop(task_folder_name(task_id), None)

    # -- paths ------------------------------------------------------------------------------------------
    def task_dir(self, task_id: str) -> Path:
        """``tasks/<folder>``: the id itself when it can name a folder, else a safe name derived from it."""
        return self.layout.task(task_id)

    def node_dir(self, task_id: str, turn: int, node: BoundNode, scope: str = "") -> Path:
        """``scope`` places a sub-agent's turns under the parent turn that called it."""
        return Path(self._node_folder(self._records_folder(task_id), turn, node, scope))

    @staticmethod
    def _node_folder(records: str, turn: int, node: BoundNode, scope: str) -> str:
        base = f"{records}/{scope}/" if scope else f"{records}/"
        return f"{base}{turn_folder(turn)}/{node.folder}"

    def _records_folder(self, task_id: str) -> str:
        """The task's folder, or (experiment.epochs > 1) the running epoch's own folder under it."""
        task = task_folder_name(task_id)
        epoch = current_epoch()
        if epoch is not None:
            task = f"{task}/{EPOCHS_DIR}/{epoch}"
        return f"{self._tasks_root}/{task}"

    # -- writing ----------------------------------------------------------------------------------------
    def write_result(self, folder: Path, result: Mapping[str, Any], timing: Mapping[str, Any] | None = None) -> None:
        """A task's (or an epoch's) ``timing.json``, when given, then its ``result.json``, which stays the last file
        of a finished task: in one hand-over to the writer thread."""
        where = str(folder)
        files: list[_Write] = []
        if timing is not None:
            files.append((where, TIMING_FILE, self.redactor.dumps(timing)))
        files.append((where, RESULT_FILE, self.redactor.dumps(result)))
        self._submit(files)

    def write_json(self, path: Path, value: Any) -> None:
        """Serialise now, write in the background."""
        path = Path(path)
        self._submit([(str(path.parent), path.name, self.redactor.dumps(value))])

    def _submit(self, files: list[_Write]) -> None:
        if self._closed:
            raise RuntimeError("the recorder is closed")
        self._writer.put(files)

    def _dumps(self, value: Any, *, scrub_fields: bool = True) -> bytes:
        # Inline media is stored once per run and referenced here.
        return self.blobs.serialize(value, lambda v: self.redactor.dumps(v, scrub_fields=scrub_fields))

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None:
        for listener in self.listeners:
            listener.on_node(ctx, node, inputs, outputs, meta)
        if self.snapshot == "none":
            return
        records = self._records_folder(ctx.task_id)
        folder = self._node_folder(records, ctx.turn, node, ctx.scope)
        dumps = self._dumps
        files: list[_Write] = [(folder, INPUT_FILE, dumps(dict(inputs)))]
        output = dumps(dict(outputs)) if outputs is not None else None
        if output is not None:
            files.append((folder, OUTPUT_FILE, output))
        if self.snapshot == "all":
            self._note_digest(records, node_key(ctx.turn, node.folder, ctx.scope), output)
        # The meta's keys are the runner's own (status, timings, error text): no credential field to look for.
        files.append((folder, META_FILE, dumps({"node": node.name, "turn": ctx.turn, **meta}, scrub_fields=False)))
        if self.snapshot == "errors":
            with self._lock:
                self._held.setdefault(ctx.task_id, []).extend(files)
            return
        self._submit(files)

    def _note_digest(self, records: str, key: str, output: bytes | None) -> None:
        """Keep the digest of a node's output (none: the node failed and wrote no output)."""
        with self._lock:
            found = self._digests.setdefault(records, Digests())
            if output is None:
                found.outputs.pop(key, None)
            else:
                found.outputs[key] = digest(output)

    def write_digests(self, task_id: str) -> None:
        """Write ``digests.json`` of the run of a task (or of the running epoch) that just ended."""
        records = self._records_folder(task_id)
        with self._lock:
            found = self._digests.pop(records, None)
        if found is not None and found.outputs:
            self._submit([(records, DIGESTS_FILE, found.to_bytes())])

    def finish_task(
        self, task_id: str, result: TaskResult | Mapping[str, Any], *, timing: Mapping[str, Any] | None = None
    ) -> None:
        """Write a task's ``result.json`` (and its ``digests.json``, and ``timing.json`` when ``timing`` is given:
        before the result, which stays the last file of a finished task); under snapshot=errors, keep its node
        records only if it failed."""
        record = TaskResult.coerce(result)
        with self._lock:
            held = self._held.pop(task_id, [])
        if held and record.status != "completed":
            self._submit(held)
        self.write_digests(task_id)
        self.write_result(self.layout.task(task_id), record.to_dict(), timing)
        for listener in self.listeners:
            listener.finish_task(task_id, record)

    def discard_task(self, task_id: str) -> None:
        """Forget node records of an attempt that will be retried (pass@k keeps the last attempt only)."""
        records = self._records_folder(task_id)
        with self._lock:
            self._held.pop(task_id, None)
            self._digests.pop(records, None)
        for listener in self.listeners:
            listener.discard_task(task_id)

    def flush(self) -> None:
        """Block until every submitted write is on disk."""
        self._writer.flush()

    async def flushed(self) -> None:
        """Wait, on the event loop, until every submitted write is on disk."""
        await self._writer.flushed()

    def close(self) -> None:
        self._closed = True
        self._writer.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_json(path: Path | str) -> Any:
    return orjson.loads(Path(path).read_bytes())
