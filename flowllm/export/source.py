"""A saved run opened for export: its summary, its config, its tasks as traces, and what is not finished yet.

A folder that is not a run raises ``ExportError`` (one line). A run without ``summary.json`` is still running
or was interrupted: it is exported with its finished tasks, and ``notes`` says so.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flowllm.errors import CliError
from flowllm.export.trace import TaskTrace, read_run_traces
from flowllm.providers.replay import REPLAY_PROTOCOL
from flowllm.rundir.layout import (
    CONFIG_FILE,
    JUDGE_LEDGER_FILE,
    LEDGER_FILE,
    OVERRIDES_FILE,
    SUMMARY_FILE,
    TASKS_DIR,
)
from flowllm.rundir.records import read_artifact
from flowllm.rundir.results import RunSummary
from flowllm.rundir.store import local_run


class ExportError(CliError):
    """Nothing can be exported (not a run, a missing optional package, an unwritable file): one line."""


@dataclass
class RunSource:
    path: Path
    summary: RunSummary | None  # None: no readable summary.json (a run still running, or interrupted)
    config: dict[str, Any] | None
    traces: list[TaskTrace]
    notes: list[str] = field(default_factory=list)

    def _counts(self, trace: TaskTrace) -> bool:
        """Whether a trace is exported. Once the run has written its summary, an epoch of a task that has no
        result.json (a budget or an interruption kept its other epochs from running) is unfinished, as the summary
        counts the task; while the run is running (or after a crash), each finished epoch is."""
        if not trace.finished:
            return False
        return self.summary is None or not trace.epoch_folder or trace.task_result is not None

    @property
    def finished(self) -> list[TaskTrace]:
        return [t for t in self.traces if self._counts(t)]

    @property
    def unfinished(self) -> list[TaskTrace]:
        return [t for t in self.traces if not self._counts(t)]

    @property
    def replay(self) -> bool:
        """Whether the run replayed (or forked) a saved one (``provider=replay``)."""
        return self.setting("provider.protocol") == REPLAY_PROTOCOL

    @property
    def unit(self) -> str:
        """What one trace is, for the console: a task, or a task's epoch in an ``experiment.epochs`` run."""
        return "task epoch(s)" if any(t.epoch_folder for t in self.traces) else "task(s)"

    def setting(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def model(self) -> str:
        summary_model = self.summary.model if self.summary is not None else None
        return str(summary_model or self.setting("provider.model") or "unknown")

    @property
    def provider(self) -> str:
        named = self.summary.provider if self.summary is not None else None
        return str(named or self.setting("provider.name") or "unknown")

    @property
    def ledger(self) -> Path:
        return self.path / LEDGER_FILE

    @property
    def judge_ledger(self) -> Path:
        return self.path / JUDGE_LEDGER_FILE

    @property
    def overrides(self) -> list[str]:
        """The run's command-line overrides (Hydra's .hydra/overrides.yaml); [] when not known."""
        try:
            loaded = yaml.safe_load((self.path / OVERRIDES_FILE).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            return []
        return [str(o) for o in loaded] if isinstance(loaded, list) else []


def open_source(path: Path | str) -> RunSource:
    run_dir = local_run(path)  # a store's URL (experiment.store): its local copy
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} is not a run directory (it does not exist or is a file)")
    summary = read_artifact(run_dir / SUMMARY_FILE)
    # A run that started no task (its budget was spent before the first) has a summary and no tasks/ folder.
    if not (run_dir / TASKS_DIR).is_dir() and not summary.ok:
        raise ExportError(
            f"{run_dir} is not a flowllm run: expected summary.json and a tasks/ folder (a run directory is what "
            "hydra.run.dir names; for a sweep, export one of its job folders)"
        )
    config: dict[str, Any] | None = None
    config_path = run_dir / CONFIG_FILE
    notes: list[str] = []
    if config_path.is_file():
        try:
            loaded = yaml.safe_load(config_path.read_text(encoding="utf-8"))
            config = loaded if isinstance(loaded, dict) else None
        except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
            notes.append(f".hydra/config.yaml cannot be read ({str(exc).splitlines()[0]}): settings not known")
    else:
        notes.append("no .hydra/config.yaml: the run's settings are not known")
    provider = (config or {}).get("provider")
    traces = read_run_traces(run_dir, replay=isinstance(provider, dict) and provider.get("protocol") == REPLAY_PROTOCOL)
    saved = RunSummary.from_dict(summary.value) if summary.ok and isinstance(summary.value, dict) else None
    source = RunSource(run_dir, saved, config, traces, notes)
    unfinished = source.unfinished
    if summary.missing:
        source.notes.insert(
            0,
            f"{run_dir} has no summary.json: the run is still running (or was interrupted); exporting the "
            f"{len(source.finished)} finished {source.unit}, leaving out {len(unfinished)} unfinished",
        )
    elif unfinished:
        left = f"{len(unfinished)} {source.unit} are unfinished (no readable result.json of their own or their task's)"
        source.notes.insert(0, f"{left} and are left out")
    return source


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Have ``write`` fill a temp file beside ``path`` (same suffix), then rename it: never a half-written file."""
    path = path.expanduser()
    if path.is_dir():
        raise ExportError(f"{path} is a folder: give a file name")
    if not path.parent.is_dir():
        raise ExportError(f"cannot write {path}: the folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise ExportError(f"could not write {path}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
