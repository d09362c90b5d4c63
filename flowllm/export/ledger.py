"""The run's usage ledger (``usage.jsonl``) read for export: its lines, and the billed cost of each task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every readable line of the ledger (a line cut by a crash is skipped); [] when there is none."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    entries: list[dict[str, Any]] = []
    for line in data.splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def task_costs(entries: list[dict[str, Any]]) -> dict[str, float | None]:
    """Billed cost per task over every attempt of every call; None for a task with an unpriced call."""
    costs: dict[str, float | None] = {}
    for entry in entries:
        if entry.get("type") != "attempt" or not entry.get("task_id"):
            continue
        task, cost = str(entry["task_id"]), entry.get("cost_usd")
        if task in costs and costs[task] is None:
            continue
        costs[task] = None if not isinstance(cost, (int, float)) else round((costs.get(task) or 0.0) + float(cost), 9)
    return costs
