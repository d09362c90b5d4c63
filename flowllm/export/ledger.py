"""The run's usage ledger (``usage.jsonl``) read for export: its lines, and the billed cost of each task (and of
each epoch of a task, from the lines' ``epoch``)."""

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
