"""The control channel of a running run (``flowllm ctl RUN CMD``): files in the run folder's ``.control/``.

    <run>/.control/driver.json            the process that answers (pid, host, user), while the run runs
    <run>/.control/requests/<id>.json     a command (written by ``flowllm ctl``, by rename)
    <run>/.control/answers/<id>.json      its answer (written by the driver, by rename)
    <run>/.control/state.json             what every process of the run follows: paused, draining, settings
    <run>/history.jsonl                   one line per command, with its time, user and answer

A polled folder, not a socket: the run's workers are other processes, and Ray's run on other machines in
scratch folders of their own, where their Ray task copies ``state.json`` from the driver (through a Ray actor)
and sends their reports back (flowllm/experiment/ray_executor.py); the driver (the run's one process, or the
parent of its workers) reads requests and writes ``state.json``, and each process that runs tasks follows that
file. A Unix socket could not reach a Ray worker, and its path (a deep Hydra folder) would often pass the
108-byte limit of a socket's name. The folder is the owner's alone (mode 0700) and the driver refuses a request
file owned by another user.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

CONTROL_DIR = ".control"
HISTORY_FILE = "history.jsonl"  # shared with the sessions' lines (flowllm/setup/fingerprint.py)


@dataclass(frozen=True)
class ControlPaths:
    root: Path  # the run folder

    @property
    def folder(self) -> Path:
        return self.root / CONTROL_DIR

    @property
    def requests(self) -> Path:
        return self.folder / "requests"

    @property
    def answers(self) -> Path:
        return self.folder / "answers"

    @property
    def state(self) -> Path:
        return self.folder / "state.json"

    @property
    def driver(self) -> Path:
        return self.folder / "driver.json"

    @property
    def shards(self) -> Path:
        """The shard files an ``experiment.workers=N`` parent hands its workers (gone with the channel)."""
        return self.folder / "shards"

    @property
    def history(self) -> Path:
        return self.root / HISTORY_FILE

    def request(self, request_id: str) -> Path:
        return self.requests / f"{request_id}.json"

    def answer(self, request_id: str) -> Path:
        return self.answers / f"{request_id}.json"

    def make(self) -> None:
        """The folders, the owner's alone."""
        for folder in (self.folder, self.requests, self.answers):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(folder, 0o700)


@dataclass
class CtlRequest:
    id: str
    command: str
    args: list[str] = field(default_factory=list)
    sent_at: str = ""

    @classmethod
    def new(cls, command: str, args: list[str]) -> CtlRequest:
        return cls(f"{time.time_ns()}-{os.getpid()}", command, list(args), now_iso())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CtlRequest:
        return cls(
            str(data["id"]), str(data["command"]), [str(a) for a in data.get("args") or []], str(data["sent_at"])
        )


@dataclass
class CtlAnswer:
    id: str
    ok: bool
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CtlAnswer:
        return cls(str(data["id"]), bool(data["ok"]), str(data["message"]), dict(data.get("data") or {}))


@dataclass
class ControlState:
    """What every process of the run follows; ``version`` grows with each change."""

    version: int = 0
    paused: bool = False
    draining: bool = False
    max_concurrent: int | None = None  # the run's tasks at once, when set while it runs
    cost_usd: float | None = None  # experiment.budget.cost_usd, when set while it runs
    requeue: list[str] = field(default_factory=list)  # failed tasks to run again at the end, in order

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ControlState:
        return cls(
            version=int(data.get("version", 0)),
            paused=bool(data.get("paused")),
            draining=bool(data.get("draining")),
            max_concurrent=None if data.get("max_concurrent") is None else int(data["max_concurrent"]),
            cost_usd=None if data.get("cost_usd") is None else float(data["cost_usd"]),
            requeue=[str(t) for t in data.get("requeue") or []],
        )


@dataclass
class DriverInfo:
    pid: int
    host: str
    uid: int
    started_at: str

    @classmethod
    def here(cls) -> DriverInfo:
        return cls(os.getpid(), socket.gethostname(), os.getuid(), now_iso())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DriverInfo:
        return cls(int(data["pid"]), str(data["host"]), int(data["uid"]), str(data["started_at"]))

    def alive(self) -> bool:
        """Whether the process is still running (on another host: assumed, the answer's wait decides)."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: it runs
            return True
        return True


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def write_record(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON at ``path``, by rename (a reader sees the old file or the new one), the owner's alone."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(orjson.dumps(data))
    os.replace(tmp, path)


def read_record(path: Path) -> dict[str, Any] | None:
    """The JSON object at ``path``; None when there is none (or it cannot be read)."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def save(path: Path, record: ControlState | DriverInfo | CtlAnswer | CtlRequest) -> None:
    write_record(path, asdict(record))


def read_state(paths: ControlPaths) -> ControlState:
    data = read_record(paths.state)
    return ControlState.from_dict(data) if data is not None else ControlState()


def read_driver(paths: ControlPaths) -> DriverInfo | None:
    data = read_record(paths.driver)
    with contextlib.suppress(KeyError, ValueError, TypeError):
        return DriverInfo.from_dict(data) if data is not None else None
    return None


def logged_answer(paths: ControlPaths, request_id: str) -> CtlAnswer | None:
    """The answer ``history.jsonl`` logged for a request: what ``ctl`` reads when the run ended (and took its
    ``.control/`` folder with it) before the answer file was read."""
    try:
        lines = paths.history.read_bytes().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(orjson.JSONDecodeError):
            entry = orjson.loads(line)
            if isinstance(entry, dict) and entry.get("id") == request_id:
                return CtlAnswer(request_id, bool(entry.get("ok")), str(entry.get("answer") or ""))
    return None


def log_command(paths: ControlPaths, request: CtlRequest, answer: CtlAnswer, uid: int) -> None:
    """One line of ``history.jsonl``: when, who, the command and its answer."""
    entry = {
        "at": now_iso(),
        "id": request.id,
        "control": request.command,
        "args": request.args,
        "uid": uid,
        "ok": answer.ok,
        "answer": answer.message,
    }
    with paths.history.open("ab") as out:  # one write of a whole line: the sessions' lines never interleave
        out.write(orjson.dumps(entry) + b"\n")
