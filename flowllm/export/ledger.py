"""The run's usage ledgers (``usage.jsonl``, ``judge_usage.jsonl``) read for export: their lines, and what each
model billed (tokens and cost) over the run, per task, and per epoch of a task (from the lines' ``epoch``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson

from flowllm.core.types import Usage
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


@dataclass
class Bill:
    """What one model billed: token counts summed over the billed attempts, and their cost (None: one was not
    priced)."""

    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = 0.0

    def add(self, entry: LedgerLine) -> None:
        if not entry.billed:
            return  # refused, lost or cut short: no tokens, nothing to pay
        self.usage += Usage.from_dict(entry.usage)
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

    def of(self, task_id: str, epoch: int | None, *, replay: bool) -> Bills | None:
        """A task's bills, or one epoch's (``epoch`` given). With no line for it: {} in a replay (every reply was
        served from the saved run: nothing billed), None elsewhere (not known: a ledger older than its lines'
        epoch, or none)."""
        found = self.tasks.get(task_id) if epoch is None else self.epochs.get((task_id, epoch))
        return found if found is not None else ({} if replay else None)

    def cost(self, task_id: str, epoch: int | None, *, replay: bool) -> float | None:
        """What the task (epoch) was billed in all, as ``of`` finds it; None when a call had no price."""
        bills = self.of(task_id, epoch, replay=replay)
        if bills is None or any(b.cost_usd is None for b in bills.values()):
            return None
        return round(sum(b.cost_usd or 0.0 for b in bills.values()), 9)


def model_bills(*ledgers: list[LedgerLine]) -> ModelBills:
    """The bills of every attempt line of ``ledgers`` (the agent's and the judge's: a run's models all told), by
    ``provider/model`` as the lines name them."""
    bills = ModelBills()
    for entry in (e for entries in ledgers for e in entries if e.type == "attempt"):
        model = f"{entry.provider or 'unknown'}/{entry.model or 'unknown'}"
        places = [bills.run]
        if entry.task_id:
            task = str(entry.task_id)
            places.append(bills.tasks.setdefault(task, {}))
            epoch = entry.epoch
            if isinstance(epoch, int) and not isinstance(epoch, bool):
                places.append(bills.epochs.setdefault((task, epoch), {}))
        for place in places:
            place.setdefault(model, Bill()).add(entry)
    return bills
