"""A saved run's epochs as the scaling figures read them: each task's scored epochs (answer, verdict) and what
each epoch cost, from the usage ledger.

Everything is read through the typed records (``TaskResult``, ``LedgerLine``): ``tasks/<id>/result.json`` holds
the task's epochs in ``epoch_log`` (a run without epochs is one epoch, the result itself), and every ``attempt``
line of ``usage.jsonl`` carries its task and epoch. An epoch that was not scored (no ground truth, a diverged
replay, a budget stop) is left out of the task's epochs; its cost still counts in the task's cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flowllm.analysis.frames import find_runs
from flowllm.errors import CliError
from flowllm.export.ledger import model_bills, read_ledger
from flowllm.run.epochs import epoch_verdict
from flowllm.rundir.layout import RESULT_FILE, RunLayout
from flowllm.rundir.results import TaskResult
from flowllm.scoring.scorers import normalize_answer

__all__ = [
    "EpochOutcome",
    "NoRun",
    "RunEpochs",
    "TaskEpochs",
    "expand_runs",
    "read_epochs",
    "read_results",
    "task_costs",
]


class NoRun(CliError):
    """A path that holds no run (nor a sweep of runs): exit status 2."""


@dataclass(frozen=True)
class EpochOutcome:
    """One scored epoch of a task: its normalised answer and its verdict."""

    answer: str
    correct: bool


@dataclass(frozen=True)
class TaskEpochs:
    """A task's scored epochs in epoch order, and what all its epochs cost (None: a call was not priced)."""

    task_id: str
    epochs: tuple[EpochOutcome, ...]
    cost_usd: float | None
    epochs_run: int = 1  # scored or not

    @property
    def epoch_cost_usd(self) -> float | None:
        return None if self.cost_usd is None else self.cost_usd / self.epochs_run

    @property
    def n(self) -> int:
        return len(self.epochs)

    @property
    def c(self) -> int:
        return sum(e.correct for e in self.epochs)


@dataclass
class RunEpochs:
    """One run folder read for scaling: its label, its epochs setting and its tasks with a scored epoch."""

    path: Path
    label: str
    epochs: int
    tasks: dict[str, TaskEpochs] = field(default_factory=dict)
    unscored: list[str] = field(default_factory=list)  # tasks with a result and no scored epoch: left out


def task_costs(run_dir: Path) -> dict[str, float | None]:
    """task id -> what the provider billed for it, all epochs together: every attempt of every call, an empty
    reply that was paid for and retried among them (None: one was not priced)."""
    bills = model_bills(read_ledger(RunLayout(run_dir).ledger))
    return {task: bills.cost(task, None, replay=False) for task in bills.tasks}


def read_results(run_dir: Path) -> list[TaskResult]:
    """Every readable ``result.json`` of the run's tasks, in task id order."""
    layout = RunLayout(run_dir)
    results = []
    for path in sorted(layout.tasks.glob(f"*/{RESULT_FILE}")) if layout.tasks.is_dir() else []:
        try:
            results.append(TaskResult.from_dict(orjson.loads(path.read_bytes())))
        except (OSError, orjson.JSONDecodeError):
            continue
    return results


def _entries(result: TaskResult) -> list[dict[str, Any]]:
    if result.epochs > 1 and result.epoch_log:
        return [e for e in result.epoch_log if isinstance(e, dict)]
    return [result.to_dict()]


def read_epochs(run_dir: Path, label: str | None = None) -> RunEpochs:
    """The run's tasks with at least one scored epoch."""
    run = RunEpochs(path=run_dir, label=label or run_dir.name, epochs=1)
    costs = task_costs(run_dir)
    for result in read_results(run_dir):
        entries = _entries(result)
        run.epochs = max(run.epochs, len(entries))
        scored = []
        for entry in entries:
            verdict = epoch_verdict(entry)
            if verdict is not None:
                scored.append(EpochOutcome(normalize_answer(str(entry.get("answer") or "")), verdict))
        if not scored:
            run.unscored.append(result.task_id)
            continue
        cost = costs.get(result.task_id, 0.0)
        run.tasks[result.task_id] = TaskEpochs(result.task_id, tuple(scored), cost, len(entries))
    return run


def _label(run: Path, given: Path) -> str:
    return given.name if run == given else f"{given.name}/{run.relative_to(given).as_posix()}"


def expand_runs(paths: Sequence[str | Path], unpack: Callable[[Path], Path] | None = None) -> list[RunEpochs]:
    """Each path's runs (a sweep folder gives its jobs), read; a path with no run is refused. A path that is a
    file is a bundle (``flowllm bundle``): ``unpack`` gives the folder of its runs, labelled by the file's name."""
    runs: list[RunEpochs] = []
    for raw in paths:
        given = Path(raw).expanduser()
        folder = unpack(given) if unpack is not None and given.is_file() else given
        found = find_runs(folder)
        if not found:
            raise NoRun(f"{given} is not a run folder nor a sweep of them (no summary.json or tasks/ found)")
        runs.extend(read_epochs(run, _label(run, folder).replace(folder.name, given.name, 1)) for run in found)
    return runs
