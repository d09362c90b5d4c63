"""The run's usage ledgers (``usage.jsonl``, ``judge_usage.jsonl``) read for export: their lines, the billed cost
of each task (and of each epoch of a task, from the lines' ``epoch``), and what each model was billed for."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flowllm.rundir.results import LedgerLine


def read_ledger(path: Path) -> list[LedgerLine]:
    """Every readable line of the ledger (a line cut by a crash is skipped); [] when there is none."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    entries: list[LedgerLine] = []
    for line in data.splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            entries.append(LedgerLine.from_dict(entry))
    return entries


def _add(costs: dict[Any, float | None], key: Hashable, cost: Any) -> None:
    if key in costs and costs[key] is None:
        return
    costs[key] = None if not isinstance(cost, (int, float)) else round((costs.get(key) or 0.0) + float(cost), 9)


@dataclass
class TaskCosts:
    """Billed cost per task over every attempt of every call, and per (task, epoch) for the lines that name
    their epoch; None for a task (epoch) with an unpriced call."""

    tasks: dict[str, float | None] = field(default_factory=dict)
    epochs: dict[tuple[str, int], float | None] = field(default_factory=dict)

    def of(self, task_id: str, epoch: int | None = None) -> float | None:
        """A task's cost, or one epoch's (``epoch`` given); None when not known (no such line, an unpriced
        call, or a ledger written before lines named their epoch)."""
        return self.tasks.get(task_id) if epoch is None else self.epochs.get((task_id, epoch))

    def has(self, task_id: str, epoch: int | None = None) -> bool:
        """Whether the ledger has a line of the task (of that epoch): a call was attempted for it."""
        return task_id in self.tasks if epoch is None else (task_id, epoch) in self.epochs


@dataclass
class Bill:
    """What one model billed: token counts summed over the billed attempts, and their cost (None: one was not
    priced)."""

    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: float | None = 0.0

    def add(self, entry: LedgerLine) -> None:
        if not entry.billed:
            return  # refused, lost or cut short: no tokens, nothing to pay
        for key, value in (entry.usage or {}).items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[key] = self.usage.get(key, 0) + value
        if self.cost_usd is not None:
            cost = entry.cost_usd
            self.cost_usd = None if not isinstance(cost, (int, float)) else round(self.cost_usd + float(cost), 9)


Bills = dict[str, Bill]  # by ``provider/model``, as the ledger names who answered


@dataclass
class ModelBills:
    """Each model's bill over the run, per task, and per (task, epoch) for the lines that name their epoch."""

    run: Bills = field(default_factory=dict)
    tasks: dict[str, Bills] = field(default_factory=dict)
    epochs: dict[tuple[str, int], Bills] = field(default_factory=dict)

    def of(self, task_id: str, epoch: int | None = None) -> Bills:
        """A task's bills, or one epoch's (``epoch`` given); {} when the ledger has no line for it."""
        return self.tasks.get(task_id, {}) if epoch is None else self.epochs.get((task_id, epoch), {})


def _bill(bills: Bills, entry: LedgerLine) -> None:
    model = f"{entry.provider or 'unknown'}/{entry.model or 'unknown'}"
    bills.setdefault(model, Bill()).add(entry)


def model_bills(*ledgers: list[LedgerLine]) -> ModelBills:
    """The bills of every attempt line of ``ledgers`` (the agent's and the judge's: a run's models all told)."""
    bills = ModelBills()
    for entry in (e for entries in ledgers for e in entries if e.type == "attempt"):
        _bill(bills.run, entry)
        if not entry.task_id:
            continue
        task = str(entry.task_id)
        _bill(bills.tasks.setdefault(task, {}), entry)
        epoch = entry.epoch
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            _bill(bills.epochs.setdefault((task, epoch), {}), entry)
    return bills


def task_costs(entries: list[LedgerLine]) -> TaskCosts:
    costs = TaskCosts()
    for entry in entries:
        if entry.type != "attempt" or not entry.task_id:
            continue
        task, cost = str(entry.task_id), entry.cost_usd
        _add(costs.tasks, task, cost)
        epoch = entry.epoch
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            _add(costs.epochs, (task, epoch), cost)
    return costs
