"""A run folder read for an audit, strictly: every file the auditor relies on parses, or the audit does not start.

Bad input (a folder that is not a run, a truncated ``result.json``, a ledger line that does not parse, a
config that cannot be read) raises ``VerifyInputError`` naming the file and, for a ledger, the line: the
command exits 2 and nothing is written anywhere. A missing ``result.json`` is no error: the task did not
finish (an interrupted or budget-stopped run), and the tallies say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from omegaconf import DictConfig, OmegaConf

from flowllm.config.saved import saved_cwd
from flowllm.datasets.adapters import DatasetSpec, load_dataset
from flowllm.datasets.shards import ShardSpec
from flowllm.datasets.task import Task
from flowllm.errors import CliError, FlowError
from flowllm.resources import bundled
from flowllm.run.outcome import outcome_problems
from flowllm.rundir.layout import RESULT_FILE, RunLayout
from flowllm.rundir.results import LedgerLine, RunSummary, TaskResult
from flowllm.rundir.store import local_run
from flowllm.spend.pricing import PriceTable

__all__ = ["NumberedLine", "RunEvidence", "VerifyInputError", "load_evidence", "read_jsonl", "saved_run"]


class VerifyInputError(CliError):
    """What ``flowllm verify`` was given cannot be audited (not a run, a file that does not parse): exit 2."""


@dataclass(frozen=True)
class NumberedLine:
    """One line of a JSONL file (``usage.jsonl``, ``judge_usage.jsonl``, ``history.jsonl``): its number in the
    file (from 1) and its value."""

    number: int
    value: dict[str, Any]

    @property
    def ledger(self) -> LedgerLine:
        """The line read as a usage ledger's."""
        return LedgerLine.from_dict(self.value)


@dataclass
class RunEvidence:
    """What a run folder holds, read once: the config as it ran, the dataset it names, every result, the
    ledgers, the summary and the fingerprint."""

    run_dir: Path
    layout: RunLayout
    cfg: DictConfig
    dataset_path: Path
    tasks: list[Task]
    summary: RunSummary
    results: dict[str, TaskResult]  # task id -> result.json
    epoch_results: dict[str, dict[int, TaskResult]]  # task id -> epoch -> its result.json
    ledger: list[NumberedLine]
    judge_ledger: list[NumberedLine]
    fingerprint: dict[str, Any] | None
    history: list[dict[str, Any]]
    prices: PriceTable | None
    price_table_path: Path

    def rel(self, path: Path) -> str:
        """``path`` as the auditor names it: relative to the run folder."""
        try:
            return path.relative_to(self.run_dir).as_posix()
        except ValueError:
            return str(path)

    @property
    def epochs(self) -> int:
        return int(self.cfg.experiment.get("epochs") or 1)


def saved_run(ev: RunEvidence, value: str) -> Path | None:
    """The run folder a replay or fork served (``provider.run_dir``, a store's URL read from its local copy; a
    relative path from the folder the audited run was started in), or one of that name beside the audited run (a
    bundle or a copied pair); None when none is at hand."""
    try:
        saved = local_run(value)
    except CliError:
        return None
    started = None if saved.is_absolute() else saved_cwd(RunLayout(ev.run_dir).hydra)
    for candidate in (*((started / saved,) if started is not None else ()), saved, ev.run_dir.parent / saved.name):
        if candidate.is_dir() and RunLayout(candidate).config.is_file():
            return candidate
    return None


def _json(path: Path, run_dir: Path) -> Any:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VerifyInputError(f"{path.relative_to(run_dir)} cannot be read: {exc.strerror or exc}") from None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise VerifyInputError(
            f"{path.relative_to(run_dir)} is not valid JSON ({len(data)} bytes; truncated?): {exc}"
        ) from None


def read_jsonl(path: Path, run_dir: Path) -> list[NumberedLine]:
    if not path.is_file():
        return []
    lines: list[NumberedLine] = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise VerifyInputError(f"{path.relative_to(run_dir)}: line {number} does not parse: {exc}") from None
        if not isinstance(value, dict):
            raise VerifyInputError(f"{path.relative_to(run_dir)}: line {number} is not a JSON object")
        lines.append(NumberedLine(number, value))
    return lines


def _result(path: Path, run_dir: Path) -> TaskResult | None:
    if not path.is_file():
        return None
    data = _json(path, run_dir)
    problems = outcome_problems(data)
    if problems:
        raise VerifyInputError(f"{path.relative_to(run_dir)} is not a task result: {'; '.join(problems[:3])}")
    return TaskResult.from_dict(data)


def _config(layout: RunLayout, run_dir: Path) -> DictConfig:
    if not layout.config.is_file():
        raise VerifyInputError(
            f"{run_dir} is not a run folder: it has no {layout.config.relative_to(run_dir)} (the config as it ran)"
        )
    try:
        cfg = OmegaConf.load(layout.config)
    except Exception as exc:  # omegaconf and yaml raise many types; all mean "unreadable config"
        raise VerifyInputError(f"{layout.config.relative_to(run_dir)} cannot be read: {exc}".splitlines()[0]) from exc
    if not isinstance(cfg, DictConfig) or "dataset" not in cfg or "experiment" not in cfg:
        raise VerifyInputError(f"{layout.config.relative_to(run_dir)} is not a flowllm config (no dataset section)")
    return cfg


def _tasks(cfg: DictConfig, dataset: Path | None) -> tuple[Path, list[Task]]:
    path = dataset if dataset is not None else bundled(str(cfg.dataset.path))
    try:
        tasks = load_dataset(DatasetSpec.from_config(cfg.dataset, path))
        shard = ShardSpec.parse(cfg.experiment.get("shard"))  # experiment.shard=I/N: the run's slice of them
        return path, tasks if shard is None else shard.select(tasks)
    except FlowError as exc:
        raise VerifyInputError(f"the run's dataset cannot be read ({exc}); give it with --dataset PATH") from exc


def _prices(cfg: DictConfig) -> tuple[Path, PriceTable | None]:
    path = bundled(str(cfg.experiment.get("pricing") or "conf/pricing.yaml"))
    try:
        return path, PriceTable.load(path)
    except FlowError:
        return path, None


def load_evidence(run_dir: Path, *, dataset: Path | None = None) -> RunEvidence:
    """Read ``run_dir`` for an audit; raises ``VerifyInputError`` (exit 2) for anything that is not a run."""
    if not run_dir.is_dir():
        raise VerifyInputError(f"{run_dir} is not a folder")
    layout = RunLayout(run_dir)
    cfg = _config(layout, run_dir)
    if not layout.summary.is_file():
        raise VerifyInputError(f"{run_dir} has no summary.json: the run wrote no figures, so none can be checked")
    summary = _json(layout.summary, run_dir)
    if not isinstance(summary, dict):
        raise VerifyInputError(f"{layout.summary.relative_to(run_dir)} is not a JSON object")
    dataset_path, tasks = _tasks(cfg, dataset)
    epochs = int(cfg.experiment.get("epochs") or 1)
    results: dict[str, TaskResult] = {}
    epoch_results: dict[str, dict[int, TaskResult]] = {}
    for task in tasks:
        found = _result(layout.result(task.task_id), run_dir)
        if found is not None:
            results[task.task_id] = found
        if epochs > 1:
            per_epoch = {}
            for epoch in range(1, epochs + 1):
                saved = _result(layout.records(task.task_id, epoch) / RESULT_FILE, run_dir)
                if saved is not None:
                    per_epoch[epoch] = saved
            epoch_results[task.task_id] = per_epoch
    fingerprint = _json(layout.fingerprint, run_dir) if layout.fingerprint.is_file() else None
    history = [line.value for line in read_jsonl(layout.history, run_dir)]
    price_path, prices = _prices(cfg)
    return RunEvidence(
        run_dir=run_dir,
        layout=layout,
        cfg=cfg,
        dataset_path=dataset_path,
        tasks=tasks,
        summary=RunSummary.from_dict(summary),
        results=results,
        epoch_results=epoch_results,
        ledger=read_jsonl(layout.ledger, run_dir),
        judge_ledger=read_jsonl(layout.judge_ledger, run_dir),
        fingerprint=fingerprint if isinstance(fingerprint, dict) else None,
        history=history,
        prices=prices,
        price_table_path=price_path,
    )
