"""The fingerprint of a run directory: every setting that can change a task's result, and the dataset's files.

A resumed run reuses the results already in its folder, so it may only run with the settings that produced
them. ``fingerprint.json`` records, when a session starts, the flattened settings that can change a task's
result (provider, model and wire settings, pipeline, repair, agent, tools, sub-agents, memory, judge, the
scorer and every other dataset setting, pass@k, the task timeout) and the SHA-256 of every dataset file.
Settings that cannot change a result never block a resume: how many tasks run at once, worker processes and
where they run, the runner (all three give identical artifacts), progress, the preflight, what the recorder
keeps, the run budget, how many epochs run, the statistics' settings, telemetry, batch mode, rate limits, the
price table (its hash is provenance), which tasks are selected (a shard among them), and the dataset's path (its
files' hashes stand for it). A selection that leaves out a task the folder holds a result of is refused all the
same (``check_selection``): the summary counts what the run selects, every reader of the folder reads it all.

A rerun into a folder that holds results of other settings is refused (``FingerprintMismatch``, exit 2),
naming each differing setting with both values; ``experiment.resume=force`` proceeds and keeps the earlier
fingerprints in ``fingerprint.json`` (``earlier``), so the mix stays on record. Every session appends one line
to ``history.jsonl`` (when, its command-line overrides, its fingerprint, its resume mode), because ``.hydra/``
holds only the last accepted session's config (flowllm.setup.config_record). Worker processes never check
or write it: their parent did, before starting them.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson
from omegaconf import DictConfig, OmegaConf

from flowllm.config.search_keys import register_resolvers
from flowllm.engine.recorder import Redactor, atomic_write, read_json
from flowllm.errors import ConfigError, FingerprintMismatch
from flowllm.rundir.layout import RESULT_FILE, RunLayout
from flowllm.rundir.taskdirs import task_folder_name

log = logging.getLogger(__name__)

# Settings (dotted prefixes) that cannot change a task's result: never part of the fingerprint.
NEUTRAL_SETTINGS = (
    "experiment.name",
    "experiment.max_concurrent",
    "experiment.resume",
    "experiment.pricing",
    "experiment.user",
    "experiment.workers",
    "experiment.executor",
    "experiment.ray_address",
    "experiment.worker_shard",
    "experiment.coordination",  # where the limits and the budget are kept, not what a task does
    "experiment.store",  # where the run's files are kept as well, not what a task does
    "experiment.shard",  # which tasks run, as dataset.task_ids: shards of one run share the fingerprint
    "experiment.budget",
    "experiment.progress_interval_s",
    "experiment.epochs",  # how many repeats: each epoch's result comes from the same settings
    "stats",  # how the results are summarised, not what they are
    "sweep",
    "telemetry",
    "provider.batch",  # the same requests, answered through the batch API
    "runner",
    "progress",
    "preflight",
    "recorder",
    "hydra",
    "provider.rate_limit",
    "provider.config_dir",  # where the provider files were found: their settings are compared, not the folder
    "dataset.path",
    "dataset.task_ids",
    "dataset.limit",
    "dataset.levels",
)
# How much of a value a refusal shows, and how many of the tasks a narrower selection leaves out.
SHOWN_CHARS = 80
SHOWN_TASKS = 3


class ResumeMode(StrEnum):
    """``experiment.resume``: true, false (run every selected task again) or force (resume across settings)."""

    on = "true"
    off = "false"
    force = "force"


def resume_mode(value: Any) -> ResumeMode:
    """``experiment.resume`` as a mode; a ``ConfigError`` naming the choices for anything else."""
    if isinstance(value, bool):
        return ResumeMode.on if value else ResumeMode.off
    text = str(value).strip().lower()
    try:
        return ResumeMode(text)
    except ValueError:
        raise ConfigError(f"experiment.resume must be true, false or force, not {value!r}") from None


def _neutral(key: str) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in NEUTRAL_SETTINGS)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``; lists and scalars are leaves, an empty mapping is one too."""
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def result_settings(cfg: DictConfig) -> dict[str, Any]:
    """The flattened settings of ``cfg`` that can change a task's result, in key order. flowllm's own resolvers
    are registered first: a process that did not compose a config (``flowllm verify``) resolves as the run did."""
    register_resolvers()
    try:
        container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    except Exception:  # an interpolation only the run resolves (${workspace}): compare it as written
        container = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    flat = flatten(container)
    # Through JSON, so that what is compared is what the file holds (tuples as lists, numbers as written).
    settings = {key: flat[key] for key in sorted(flat) if not _neutral(key)}
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(settings, default=str))
    return loaded


def dataset_files(path: Path) -> dict[str, str]:
    """``{relative name: sha256}`` of the dataset: the file, or every file under the folder (hidden ones
    aside); empty when it is not there (the preflight says so)."""
    if path.is_file():
        files = [path]
        root = path.parent
    elif path.is_dir():
        files = sorted(
            p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.parts[-1:])
        )
        root = path
    else:
        return {}
    hashes: dict[str, str] = {}
    for file in files:
        with file.open("rb") as handle:
            hashes[file.relative_to(root).as_posix()] = hashlib.file_digest(handle, "sha256").hexdigest()
    return hashes


@dataclass(frozen=True)
class Fingerprint:
    """What produced a folder's results: the settings that can change them and the dataset's files."""

    settings: dict[str, Any]
    dataset_files: dict[str, str]
    # Earlier fingerprints whose results are still in the folder (kept by experiment.resume=force).
    earlier: list[dict[str, Any]] = field(default_factory=list)

    @property
    def digest(self) -> str:
        body = {"settings": self.settings, "dataset_files": self.dataset_files}
        return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.digest,
            "settings": self.settings,
            "dataset_files": self.dataset_files,
            "earlier": self.earlier,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Fingerprint | None:
        if not isinstance(data, dict):
            return None
        settings, files = data.get("settings"), data.get("dataset_files")
        if not isinstance(settings, dict) or not isinstance(files, dict):
            return None
        earlier = data.get("earlier")
        return cls(settings, files, list(earlier) if isinstance(earlier, list) else [])


def compute(cfg: DictConfig, dataset_path: Path) -> Fingerprint:
    return Fingerprint(result_settings(cfg), dataset_files(dataset_path))


def read_fingerprint(run_dir: Path) -> Fingerprint | None:
    """The folder's recorded fingerprint; None when there is none or it cannot be read."""
    path = RunLayout(Path(run_dir)).fingerprint
    if not path.is_file():
        return None
    try:
        return Fingerprint.from_dict(read_json(path))
    except Exception:
        return None


def _shown(value: Any) -> str:
    text = orjson.dumps(value, default=str).decode() if not isinstance(value, str) else repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


_ABSENT = object()


def differences(saved: Fingerprint, now: Fingerprint) -> list[str]:
    """One line per setting or dataset file that differs: ``repair.name: 'full' before, 'strict' now``."""
    lines = []
    for key in sorted(set(saved.settings) | set(now.settings)):
        old, new = saved.settings.get(key, _ABSENT), now.settings.get(key, _ABSENT)
        if old != new:
            before = "not set" if old is _ABSENT else _shown(old)
            after = "not set" if new is _ABSENT else _shown(new)
            lines.append(f"{key}: {before} before, {after} now")
    for name in sorted(set(saved.dataset_files) | set(now.dataset_files)):
        old_hash, new_hash = saved.dataset_files.get(name), now.dataset_files.get(name)
        if old_hash != new_hash:
            before = "absent" if old_hash is None else f"sha256 {old_hash[:12]}"
            after = "absent" if new_hash is None else f"sha256 {new_hash[:12]}"
            lines.append(f"dataset file {name}: {before} before, {after} now")
    return lines


def _has_results(layout: RunLayout) -> bool:
    return layout.tasks.is_dir() and any(layout.tasks.glob(f"*/{RESULT_FILE}"))


def check_selection(run_dir: Path, selected: Iterable[str], setting: str = "hydra.run.dir") -> None:
    """A rerun must select every task the folder holds a result of: its summary counts the tasks it selects, and
    every reader of the folder (exports, diff, scale, a bundle) reads them all. Raises ``FingerprintMismatch``
    naming the tasks left out (a wider selection resumes: the new tasks run, the others are kept)."""
    layout = RunLayout(Path(run_dir))
    if not _has_results(layout):
        return
    folders = {task_folder_name(task_id) for task_id in selected}
    left_out = sorted(p.parent.name for p in layout.tasks.glob(f"*/{RESULT_FILE}") if p.parent.name not in folders)
    if not left_out:
        return
    shown = ", ".join(left_out[:SHOWN_TASKS]) + (", ..." if len(left_out) > SHOWN_TASKS else "")
    tasks = "task" if len(left_out) == 1 else "tasks"
    raise FingerprintMismatch(
        f"{layout.root} holds results of {len(left_out)} {tasks} this run does not select ({shown}): its summary "
        f"would count fewer tasks than the folder holds; select them too, or run into a new {setting}"
    )


def _mismatch(layout: RunLayout, changed: list[str], setting: str = "hydra.run.dir") -> FingerprintMismatch:
    first = (
        f"{layout.root} holds results of other settings; rerun into a new {setting}, or keep them and mix with "
        "experiment.resume=force. What differs:"
    )
    return FingerprintMismatch("\n".join([first, *changed]))


def check(cfg: DictConfig, run_dir: Path, dataset_path: Path, *, setting: str = "hydra.run.dir") -> None:
    """What ``guard`` refuses, found without writing anything (a sweep checks every job's folder before its first
    job runs): ``FingerprintMismatch`` naming ``setting`` as the way out."""
    layout = RunLayout(Path(run_dir))
    saved = read_fingerprint(layout.root)
    if saved is None or not _has_results(layout) or resume_mode(cfg.experiment.resume) is ResumeMode.force:
        return
    changed = differences(saved, compute(cfg, dataset_path))
    if changed:
        raise _mismatch(layout, changed, setting)


def guard(
    cfg: DictConfig,
    run_dir: Path,
    dataset_path: Path,
    *,
    overrides: Iterable[str] = (),
    redactor: Redactor | None = None,
    concurrency: Mapping[str, int] | None = None,
) -> Fingerprint:
    """Check that the folder's results came from these settings, then record them (see the module's text).
    ``concurrency`` (tasks at once per process, and processes) goes on the session's line: how many calls this
    session could have in flight, which bounds how far past a budget it may spend (``flowllm verify``).

    Raises ``FingerprintMismatch`` (one line per differing setting) unless ``experiment.resume=force``."""
    mode = resume_mode(cfg.experiment.resume)
    layout = RunLayout(Path(run_dir))
    now = compute(cfg, dataset_path)
    saved = read_fingerprint(layout.root)
    has_results = _has_results(layout)
    forced_over: str | None = None
    if saved is not None and has_results:
        changed = differences(saved, now)
        if changed and mode is not ResumeMode.force:
            raise _mismatch(layout, changed)
        if changed:
            forced_over = saved.digest
            earlier = [*saved.earlier, {k: v for k, v in saved.to_dict().items() if k != "earlier"}]
            now = Fingerprint(now.settings, now.dataset_files, earlier)
            log.warning(
                "flowllm: experiment.resume=force: this folder now mixes results of %d settings (fingerprint.json)",
                len(earlier) + 1,
            )
        else:
            now = Fingerprint(now.settings, now.dataset_files, saved.earlier)
    elif saved is None and has_results:
        log.warning(
            "flowllm: %s has results but no fingerprint.json (an older flowllm wrote it): its settings cannot be "
            "checked; these are recorded from now on",
            layout.root,
        )
    redactor = redactor or Redactor()
    layout.root.mkdir(parents=True, exist_ok=True)
    atomic_write(layout.fingerprint, redactor.dumps(now.to_dict()))
    entry: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "overrides": list(overrides),
        "fingerprint": now.digest,
        "resume": mode.value,
        "forced_over": forced_over,
    }
    if concurrency is not None:
        entry["concurrency"] = dict(concurrency)
    with layout.history.open("ab") as handle:  # appended, never rewritten: what ran in this folder, in order
        handle.write((redactor.mask(orjson.dumps(entry).decode()) or "").encode() + b"\n")
    return now


def hydra_overrides() -> list[str]:
    """The command-line overrides of this Hydra job (empty when not run by Hydra, as in tests)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return [str(o) for o in HydraConfig.get().overrides.task]
    except ValueError:
        return []
