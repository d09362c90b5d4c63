"""``flowllm merge SHARD... -o RUN``: the folders of ``experiment.shard=I/N`` runs put together into one run.

Every shard must have run with the same settings: their ``fingerprint.json`` files are compared as a resume
compares them (flowllm/setup/fingerprint.py) and a difference is refused, naming each differing setting. The
merged folder gets every shard's task folders (a task found in two shards is refused), the ledgers' lines
(``usage.jsonl``, ``judge_usage.jsonl``), the sessions' ``history.jsonl`` lines, the web cache and the logs; its
config is the shards' with ``experiment.shard`` unset. Its ``summary.json`` is then computed once, from the merged
folder, by the function a one-process run uses (flowllm/setup/build.py ``run_summary``), so the merged run is
what one run of the same tasks would have written (wall time aside: the longest shard's).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from flowllm.config.schema import FlowConfig
from flowllm.datasets.shards import SHARD_SETTING, ShardSpec, shard_override
from flowllm.engine.recorder import Redactor, atomic_write, read_json
from flowllm.errors import CliError
from flowllm.experiment.workers import scorer_rules
from flowllm.providers import provider_secrets
from flowllm.run.outcome import load_outcomes
from flowllm.run.runner import RunResult
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import RunSummary
from flowllm.setup.build import prepare, run_summary
from flowllm.setup.fingerprint import Fingerprint, differences, read_fingerprint

log = logging.getLogger(__name__)

__all__ = ["MergeResult", "merge_shards"]

# Append-only records of a run folder: the merged folder holds every shard's lines, shard after shard.
_APPENDED = ("ledger", "judge_ledger", "history", "log")
BUDGET_CAPS = ("cost_usd", "tokens")  # experiment.budget's caps (flowllm/config/schema.py BudgetConfig)


@dataclass
class _Shard:
    """One shard folder, read: its fingerprint, its config, its summary and its spec."""

    layout: RunLayout
    fingerprint: Fingerprint
    config: DictConfig
    summary: RunSummary | None
    spec: ShardSpec | None


@dataclass
class MergeResult:
    """What ``merge_shards`` wrote: the merged run's folder and summary, and what it noticed."""

    run_dir: Path
    summary: RunSummary
    missing_shards: list[int]


def _read_shard(folder: Path) -> _Shard:
    layout = RunLayout(folder)
    if not folder.is_dir():
        raise CliError(f"{folder} is not a folder: give the shards' run folders")
    fingerprint = read_fingerprint(folder)
    if fingerprint is None or not layout.config.is_file():
        raise CliError(f"{folder} is not a flowllm run folder (no fingerprint.json or .hydra/config.yaml)")
    try:
        saved = OmegaConf.load(layout.config)
        assert isinstance(saved, DictConfig)
        config = OmegaConf.merge(OmegaConf.structured(FlowConfig), saved)
    except Exception as exc:  # omegaconf and yaml raise many types; all mean "a config this version cannot read"
        raise CliError(f"{layout.config} cannot be read: {str(exc).splitlines()[0]}") from None
    assert isinstance(config, DictConfig)
    summary = RunSummary.from_dict(read_json(layout.summary)) if layout.summary.is_file() else None
    try:
        spec = ShardSpec.parse(OmegaConf.select(config, SHARD_SETTING))
    except ValueError as exc:
        raise CliError(f"{folder}: {exc}") from None
    return _Shard(layout, fingerprint, config, summary, spec)


def _check_shards(shards: list[_Shard]) -> list[int]:
    """Refuse shards that are not parts of one run; the indices of the run's shards not given (none: [])."""
    first = shards[0]
    for other in shards[1:]:
        changed = differences(first.fingerprint, other.fingerprint)
        if changed:
            what = "; ".join(
                line.replace(" before, ", f" in {first.layout.root}, ").replace(" now", "") for line in changed
            )
            raise CliError(f"{other.layout.root} ran with other settings than {first.layout.root}: {what}")
    specs = [s.spec for s in shards]
    if any(spec is None for spec in specs):
        plain = next(s for s in shards if s.spec is None)
        raise CliError(f"{plain.layout.root} is no shard (it ran without experiment.shard=I/N)")
    counts = {spec.count for spec in specs if spec is not None}
    if len(counts) > 1:
        raise CliError(
            f"the shards split the tasks differently (N = {', '.join(map(str, sorted(counts)))}): merge one split"
        )
    seen: dict[int, Path] = {}
    for shard in shards:
        assert shard.spec is not None
        if shard.spec.index in seen:
            raise CliError(f"{seen[shard.spec.index]} and {shard.layout.root} are both shard {shard.spec}")
        seen[shard.spec.index] = shard.layout.root
    return [i for i in range(counts.pop()) if i not in seen]


def _copy_tasks(shards: list[_Shard], target: RunLayout) -> None:
    owner: dict[str, Path] = {}
    target.tasks.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        if not shard.layout.tasks.is_dir():
            continue
        for folder in sorted(shard.layout.tasks.iterdir()):
            if folder.name in owner:
                raise CliError(f"task folder {folder.name} is in {owner[folder.name]} and in {shard.layout.root}")
            owner[folder.name] = shard.layout.root
            shutil.copytree(folder, target.tasks / folder.name, symlinks=True)


def _append_records(shards: list[_Shard], target: RunLayout) -> None:
    for name in _APPENDED:
        parts = [getattr(s.layout, name) for s in shards if getattr(s.layout, name).is_file()]
        if not parts and name != "ledger":
            continue
        with getattr(target, name).open("wb") as out:
            for part in parts:
                data = part.read_bytes()
                out.write(data if not data or data.endswith(b"\n") else data + b"\n")


def _merged_budget(shards: list[_Shard]) -> dict[str, float | int | None]:
    """The merged run's ``experiment.budget``: the shards' one cap when they kept their spend together
    (``experiment.coordination``, the same for all), else the sum of the caps each shard had for itself (a cap
    is None, no cap, when a shard ran without it)."""
    budgets = [s.config.experiment.get("budget") or {} for s in shards]
    places = {s.config.experiment.get("coordination") for s in shards}
    if len(places) == 1 and None not in places:
        return {key: budgets[0].get(key) for key in BUDGET_CAPS}
    merged: dict[str, float | int | None] = {}
    for key in BUDGET_CAPS:
        caps = [b.get(key) for b in budgets]
        merged[key] = None if any(c is None for c in caps) else round(sum(c for c in caps if c is not None), 9)
    return merged


def _write_config(shards: list[_Shard], target: RunLayout) -> DictConfig:
    """The merged run's config: the shards', with ``experiment.shard`` unset and the budget the shards had
    together; the first shard's fingerprint."""
    first = shards[0]
    config = first.config.copy()
    with open_dict(config):
        config.experiment.shard = None
        for key, cap in _merged_budget(shards).items():
            config.experiment.budget[key] = cap
    target.config.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target.config, OmegaConf.to_yaml(config).encode())
    if first.layout.hydra.is_file():
        shutil.copy2(first.layout.hydra, target.hydra)
    overrides = OmegaConf.load(first.layout.overrides) if first.layout.overrides.is_file() else None
    kept = [o for o in (overrides or []) if shard_override(o) is None]
    atomic_write(target.overrides, OmegaConf.to_yaml(OmegaConf.create(kept)).encode())
    shutil.copy2(first.layout.fingerprint, target.fingerprint)
    return config


def _summary(
    config: DictConfig, shards: list[_Shard], target: RunLayout, missing: list[int]
) -> tuple[RunSummary, list[str]]:
    """The merged run's summary, computed once by the function a one-process run uses, and the key values it
    must not show."""
    parts = prepare(config)
    rules = scorer_rules(config, target.root) if config.dataset.scorer != "judge" else None
    outcomes = load_outcomes(target.root, parts.tasks, rules)
    saved = [s.summary for s in shards if s.summary is not None]
    interrupted = bool(missing) or len(saved) < len(shards) or any(s.interrupted for s in saved)
    unavailable: dict[str, str] = {}
    known = all(s.tools is not None and s.tools.unavailable is not None for s in saved) and bool(saved)
    for s in saved:
        if s.tools is not None and s.tools.unavailable:
            unavailable.update(s.tools.unavailable)
    result = RunResult(outcomes, interrupted, 0, tools_unavailable=unavailable if known else None, tools_start_s=None)
    wall = max((s.wall_seconds or 0.0 for s in saved), default=0.0)
    summary = run_summary(config, parts, result, target.root, wall_seconds=wall)
    if saved and saved[0].provider:  # the config choice the shards' app read from Hydra (offline_chat, not offline)
        summary.provider = saved[0].provider
    if summary.tools is not None:
        summary.tools.sandbox_gaps = None  # probed by each shard's process, not here
    return summary, provider_secrets(parts.provider_cfg, resolve=parts.providers)


def merge_shards(folders: list[Path], output: Path) -> MergeResult:
    """Merge the shard folders into ``output`` (a new or empty folder); ``CliError`` (exit 2) when they are not
    the shards of one run or ``output`` holds something."""
    if not folders:
        raise CliError("give the shards' run folders to merge")
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise CliError(f"{output} exists and is not empty: merge into a new folder")
    shards = [_read_shard(Path(f)) for f in folders]
    shards.sort(key=lambda s: s.spec.index if s.spec is not None else -1)
    missing = _check_shards(shards)
    target = RunLayout(output)
    target.root.mkdir(parents=True, exist_ok=True)
    config = _write_config(shards, target)
    for shard in shards:
        if shard.layout.web_cache.is_dir():
            shutil.copytree(shard.layout.web_cache, target.web_cache, dirs_exist_ok=True)
    _copy_tasks(shards, target)
    _append_records(shards, target)
    summary, secrets = _summary(config, shards, target, missing)
    atomic_write(target.summary, Redactor(secrets).dumps(summary.to_dict()))
    return MergeResult(output, summary, missing)
