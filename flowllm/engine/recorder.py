"""The recorder: every node's input and output on disk, so any turn of any task can be read, replayed, diffed.

Layout under the run directory:

    tasks/<task_id>/turn_<NNN>/<NN>_<node>/input.json    what the node received
    tasks/<task_id>/turn_<NNN>/<NN>_<node>/output.json   what it produced (nothing run-specific)
    tasks/<task_id>/turn_<NNN>/<NN>_<node>/meta.json     start, duration, status, error and traceback
    tasks/<task_id>/turn_<NNN>/subagents/<name>-<call_id>/turn_<MMM>/...  a sub-agent's turns
    tasks/<task_id>/result.json
    summary.json

Serialisation (orjson) happens on the caller's thread, at once, so later mutation cannot change what was
recorded; file writes go to one background thread so the event loop never waits on the disk. Every file is
written atomically (temp file in the same folder, then rename). Secrets never reach disk: the values of the
configured key variables are masked wherever they appear, and any mapping key that names a credential
(``authorization``, ``x-api-key``, ``api_key``...) has its value masked.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from flowllm.engine.context import TurnContext
from flowllm.engine.node import BoundNode

SNAPSHOT_MODES = ("all", "errors", "none")
REDACTED = "[redacted]"
_SECRET_KEY = re.compile(
    r"^(authorization|proxy-authorization|x-api-key|api[-_]?key|.*_api_key|secret)$", re.I
)
_SECRET_HINT = re.compile(rb"authorization|api[-_]?key|secret", re.I)
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


class Redactor:
    """Masks secret values and credential-named fields in serialised JSON."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Short values would mask innocent text; real keys are long.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True)

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {
                k: (REDACTED if isinstance(k, str) and _SECRET_KEY.match(k) else self._scrub(v))
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self._scrub(v) for v in value]
        return value

    def dumps(self, value: Any) -> bytes:
        data = orjson.dumps(value, default=_default, option=_OPTIONS)
        if _SECRET_HINT.search(data):
            # Rare: only payloads that mention a credential field pay for the walk.
            data = orjson.dumps(self._scrub(orjson.loads(data)), option=_OPTIONS)
        for secret in self.secrets:
            encoded = secret.encode()
            if encoded in data:
                data = data.replace(encoded, REDACTED.encode())
        return data + b"\n"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader (or a crash) sees the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


class Recorder:
    """Writes a run's artifacts. One instance per run; thread-safe; ``close()`` waits for pending writes."""

    def __init__(self, run_dir: Path | str, snapshot: str = "all", secrets: Iterable[str] = ()) -> None:
        if snapshot not in SNAPSHOT_MODES:
            raise ValueError(
                f"recorder.snapshot must be one of {', '.join(SNAPSHOT_MODES)}, not '{snapshot}'"
            )
        self.run_dir = Path(run_dir)
        self.snapshot = snapshot
        self.redactor = Redactor(secrets)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowllm-recorder")
        self._pending: set[Future[None]] = set()
        self._lock = threading.Lock()
        # snapshot=errors keeps a task's node records in memory until we know whether the task failed.
        self._held: dict[str, list[tuple[Path, bytes]]] = {}

    # -- paths ------------------------------------------------------------------------------------------
    def task_dir(self, task_id: str) -> Path:
        return self.run_dir / "tasks" / task_id

    def node_dir(self, task_id: str, turn: int, node: BoundNode, scope: str = "") -> Path:
        """``scope`` places a sub-agent's turns under the parent turn that called it."""
        base = self.task_dir(task_id)
        if scope:
            base = base / scope
        return base / f"turn_{turn:03d}" / node.folder

    # -- writing ----------------------------------------------------------------------------------------
    def write_json(self, path: Path, value: Any) -> None:
        """Serialise now, write in the background."""
        self._submit(path, self.redactor.dumps(value))

    def _submit(self, path: Path, data: bytes) -> None:
        future = self._writer.submit(atomic_write, path, data)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None:
        if self.snapshot == "none":
            return
        folder = self.node_dir(ctx.task_id, ctx.turn, node, ctx.scope)
        files = [(folder / "input.json", self.redactor.dumps(dict(inputs)))]
        if outputs is not None:
            files.append((folder / "output.json", self.redactor.dumps(dict(outputs))))
        files.append(
            (folder / "meta.json", self.redactor.dumps({"node": node.name, "turn": ctx.turn, **meta}))
        )
        if self.snapshot == "errors":
            with self._lock:
                self._held.setdefault(ctx.task_id, []).extend(files)
            return
        for path, data in files:
            self._submit(path, data)

    def finish_task(self, task_id: str, result: Mapping[str, Any]) -> None:
        """Write a task's ``result.json``; under snapshot=errors, keep its node records only if it failed."""
        with self._lock:
            held = self._held.pop(task_id, [])
        if result.get("status") != "completed":
            for path, data in held:
                self._submit(path, data)
        self.write_json(self.task_dir(task_id) / "result.json", dict(result))

    def discard_task(self, task_id: str) -> None:
        """Forget node records of an attempt that will be retried (pass@k keeps the last attempt only)."""
        with self._lock:
            self._held.pop(task_id, None)

    def flush(self) -> None:
        """Block until every submitted write is on disk."""
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return
            for future in pending:
                future.result()

    def close(self) -> None:
        self.flush()
        self._writer.shutdown(wait=True)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_json(path: Path | str) -> Any:
    return orjson.loads(Path(path).read_bytes())
