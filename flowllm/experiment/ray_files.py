"""The files of ``experiment.executor=ray``: what the driver ships to a worker, and what a worker sends back.

Nothing is on a path the driver and the workers share. The driver packs what a worker reads into one tar blob
that goes through Ray's object store: every path named on the command line (``--config-dir``, ``dataset.path``,
an emulator script, a replayed run's folder...) under ``inputs/``, rewritten to that relative place, and, under
``run/``, the run's ledgers and the folders of the worker's tasks an earlier session left unfinished (what a
resume continues from). The worker unpacks it in a scratch folder of its node and runs there.

While its worker runs, the Ray task sends ``Batch``es back: the ledgers' new whole lines, then the whole
folder of each task whose ``result.json`` appeared (so a task's lines always come before its result), and at
the end the task folders changed since they were sent and the run folder's other files (logs appended, the
rest written). The driver writes them into the run folder with the recorder's ``atomic_write``, a task's
``result.json`` last, as a one-process run leaves them.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from flowllm.engine.recorder import atomic_write
from flowllm.run.control import FOLLOWERS_DIR
from flowllm.rundir.control import CONTROL_DIR, ControlPaths
from flowllm.rundir.layout import (
    HISTORY_FILE,
    JUDGE_LEDGER_FILE,
    LEDGER_FILE,
    RESULT_FILE,
    RESUME_DIR,
    TASKS_DIR,
    RunLayout,
)

INPUTS_DIR = "inputs"  # in the worker's scratch folder: the shipped paths of the command line
RUN_DIR = "run"  # in the worker's scratch folder: the worker's own run folder
APPENDED = (LEDGER_FILE, JUDGE_LEDGER_FILE, HISTORY_FILE)  # the run's line files: every worker appends to them
FOLLOWERS = f"{CONTROL_DIR}/{FOLLOWERS_DIR}"  # what each worker did of flowllm ctl's state (run/control.py)
_NOT_RETURNED = (TASKS_DIR, RESUME_DIR, CONTROL_DIR, ".rate_limit_pauses", *APPENDED)

Files = dict[str, bytes]  # path relative to a folder -> its bytes
Signature = tuple[tuple[str, int, int], ...]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("\\'", "'").replace("\\\\", "\\")
    return value


def _names_a_path(value: str) -> Path | None:
    """An override's value that names a file or folder here (a group choice such as ``tools=default`` does not)."""
    plain = _unquote(value)
    if not plain or ("/" not in plain and not plain.startswith(".")):
        return None
    path = Path(plain).expanduser()
    return path.resolve() if path.exists() else None


def ship_inputs(command: list[str], run_dir: Path, task_ids: list[str]) -> tuple[list[str], bytes]:
    """The worker's arguments (after ``python -m flowllm``) with every path they name shipped, and the blob."""
    buffer = io.BytesIO()
    shipped: list[str] = []

    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def ship(path: Path) -> str:
            place = f"{INPUTS_DIR}/{len(shipped)}/{path.name}"
            tar.add(path, arcname=place)
            shipped.append(place)
            return place

        args, rest = [], command[3:]  # the driver's interpreter and "-m flowllm" are the node's own there
        while rest:
            arg = rest.pop(0)
            if arg == "--config-dir" and rest:
                args += [arg, ship(Path(rest.pop(0)).resolve())]
                continue
            key, sep, value = arg.partition("=")
            if key == "hydra.run.dir":  # the worker's run folder is in its scratch folder
                continue
            path = _names_a_path(value) if sep and not key.lstrip("+~").startswith("hydra.") else None
            args.append(f"{key}={ship(path)}" if path is not None else arg)
        _ship_run_state(tar, RunLayout(run_dir), task_ids)
    return args, buffer.getvalue()


def _ship_run_state(tar: tarfile.TarFile, layout: RunLayout, task_ids: list[str]) -> None:
    """The run's ledgers (the spend the budget and per-task limits count) and the unfinished tasks' folders."""
    for name in (LEDGER_FILE, JUDGE_LEDGER_FILE):
        if (layout.root / name).is_file():
            tar.add(layout.root / name, arcname=f"{RUN_DIR}/{name}")
    for task_id in task_ids:
        for folder, place in (
            (layout.task(task_id), f"{TASKS_DIR}/{task_id}"),
            (layout.resume.task(task_id), f"{RESUME_DIR}/{TASKS_DIR}/{task_id}"),
        ):
            if folder.is_dir():
                tar.add(folder, arcname=f"{RUN_DIR}/{place}")


def unpack(blob: bytes, into: Path) -> None:
    if blob:
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(into, filter="data")


def read_folder(folder: Path) -> Files:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def signature(folder: Path) -> Signature:
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            st = path.stat()
            found.append((str(path.relative_to(folder)), st.st_mtime_ns, st.st_size))
    return tuple(found)


@dataclass
class Batch:
    """What one look at a worker's run folder found: new ledger lines, finished tasks' folders, other files."""

    lines: dict[str, bytes] = field(default_factory=dict)
    tasks: dict[str, Files] = field(default_factory=dict)
    extra: Files = field(default_factory=dict)
    control: Files = field(default_factory=dict)  # the worker's reports to flowllm ctl's driver

    def __bool__(self) -> bool:
        return bool(self.lines or self.tasks or self.extra or self.control)


@dataclass
class FolderSender:
    """On the worker's node: what of its run folder has not been sent yet."""

    run_dir: Path
    task_ids: list[str]
    offsets: dict[str, int] = field(default_factory=dict)
    sent: dict[str, Signature] = field(default_factory=dict)
    reports: Signature = ()

    def __post_init__(self) -> None:
        layout = RunLayout(self.run_dir)
        for name in APPENDED:  # the shipped ledgers' lines are the driver's already
            path = self.run_dir / name
            self.offsets[name] = path.stat().st_size if path.is_file() else 0
        for task_id in self.task_ids:  # a shipped (unfinished) folder is sent once its task has run again
            if layout.task(task_id).is_dir():
                self.sent[task_id] = signature(layout.task(task_id))

    def _new_lines(self) -> dict[str, bytes]:
        lines = {}
        for name, offset in self.offsets.items():
            path = self.run_dir / name
            if not path.is_file():
                continue
            with path.open("rb") as fh:
                fh.seek(offset)
                data = fh.read()
            whole = data[: data.rfind(b"\n") + 1]
            if whole:
                lines[name] = whole
                self.offsets[name] = offset + len(whole)
        return lines

    def poll(self, *, final: bool = False) -> Batch:
        """Tasks whose folder changed since sent (before ``final``: those with a ``result.json`` only); their
        ledger lines are read after, so they come with them."""
        layout = RunLayout(self.run_dir)
        ready = []
        for task_id in self.task_ids:
            folder = layout.task(task_id)
            if not (folder / RESULT_FILE).is_file():
                continue
            now = signature(folder)
            if now != self.sent.get(task_id):
                ready.append((task_id, now))
        batch = Batch(lines=self._new_lines())
        reports = self.run_dir / FOLLOWERS
        now_reports = signature(reports) if reports.is_dir() else ()
        if now_reports != self.reports:
            batch.control = {f"{FOLLOWERS}/{rel}": data for rel, data in read_folder(reports).items()}
            self.reports = now_reports
        for task_id, now in ready:
            batch.tasks[task_id] = read_folder(layout.task(task_id))
            self.sent[task_id] = now
        if final:
            batch.extra = {
                rel: data for rel, data in read_folder(self.run_dir).items() if not rel.startswith(_NOT_RETURNED)
            }
        return batch


def _drop_resumed(layout: RunLayout, task_id: str) -> None:
    """The task's result is written: the turns an earlier session left aside for it are dropped (and
    ``.resume`` with them once empty), as a one-process run drops them (run/resume.py)."""
    shutil.rmtree(layout.resume.task(task_id), ignore_errors=True)
    for folder in (layout.resume.tasks, layout.resume.root):
        with contextlib.suppress(OSError):
            folder.rmdir()


def receive(batch: Batch, run_dir: Path) -> None:
    """On the driver: a worker's batch written into the run folder (ledger lines appended in one write each,
    each task's folder replaced with ``result.json`` written last)."""
    layout = RunLayout(run_dir)
    for name, data in batch.lines.items():
        with (run_dir / name).open("ab") as fh:
            fh.write(data)
    for task_id, files in batch.tasks.items():
        folder = layout.task(task_id)
        if folder.is_dir():  # an earlier session's records: the worker started from them (shipped)
            shutil.rmtree(folder)
        for rel, data in sorted(files.items(), key=lambda item: item[0] == RESULT_FILE):
            atomic_write(folder / rel, data)
        _drop_resumed(layout, task_id)
    for rel, data in batch.control.items():
        atomic_write(run_dir / rel, data)
    for rel, data in batch.extra.items():
        target = run_dir / rel
        if rel.endswith(".log"):
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("ab") as fh:
                fh.write(data)
        elif not target.exists():
            atomic_write(target, data)


def follow_state(state: bytes, run_dir: Path) -> None:
    """On the worker's node: the driver's ``.control/state.json`` (flowllm ctl), for the worker to follow."""
    path = ControlPaths(run_dir).state
    if state and (not path.is_file() or path.read_bytes() != state):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, state)


def scratch_env(root: Path) -> dict[str, str]:
    """The worker's environment: the node's, with its 429 pauses kept in its scratch folder."""
    from flowllm.providers.limiter import SHARED_PAUSES_ENV

    return {**os.environ, SHARED_PAUSES_ENV: str(root / RUN_DIR / ".rate_limit_pauses")}
