"""What each task was billed, from the usage ledger (``usage.jsonl``): every attempt, failed tasks included.

A task's ``result.json`` counts the usage of the answer it recorded, so a task that failed after five paid
calls shows 0 there. The ledger has every attempt with its task, tokens and cost: this is what the console
table, ``inspect`` and the HTML report show per task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from flowllm.core.types import Usage
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import LedgerLine


@dataclass
class TaskBill:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = 0.0  # None when a billed model has no price
    estimated: bool = False  # some counts were estimated (the server reported none)
    calls: int = 0
    attempts: int = 0
    failed_attempts: int = 0
    fallbacks: int = 0  # calls answered by a fallback provider

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def retries(self) -> int:
        return max(0, self.attempts - self.calls)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_tokens": self.total_tokens, "retries": self.retries}


def bills_by_task(lines: Iterable[LedgerLine | Mapping[str, Any]]) -> dict[str, TaskBill]:
    bills: dict[str, TaskBill] = {}
    for raw in lines:
        line = LedgerLine.coerce(raw)
        task = line.task_id
        if task is None:
            continue
        bill = bills.setdefault(str(task), TaskBill())
        if line.type == "call":
            bill.calls += 1
            bill.fallbacks += int(bool(line.fallback) and line.ok)
        elif line.type == "attempt":
            bill.attempts += 1
            if not line.ok:
                bill.failed_attempts += 1
            if not line.billed:
                continue
            usage = Usage.from_dict(line.usage)
            bill.input_tokens += usage.input_tokens
            bill.output_tokens += usage.output_tokens
            bill.cache_read_tokens += usage.cache_read_tokens
            bill.cache_write_tokens += usage.cache_write_tokens
            bill.estimated = bill.estimated or usage.estimated
            cost = line.cost_usd
            bill.cost_usd = None if cost is None or bill.cost_usd is None else bill.cost_usd + float(cost)
    return bills


def read_bills(run_dir: Path | str) -> dict[str, TaskBill]:
    """The bills of a run folder; empty when it has no ledger (older runs, replays of them)."""
    path = RunLayout(Path(run_dir)).ledger
    if not path.is_file():
        return {}
    lines = []
    for raw in path.read_bytes().splitlines():
        if raw.strip():
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:  # a line cut by a crash: the rest still counts
                continue
            if isinstance(value, dict):
                lines.append(LedgerLine.from_dict(value))
    return bills_by_task(lines)
