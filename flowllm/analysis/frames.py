"""Run directories as four dataframes: runs, tasks (one row per task and epoch), calls (the ledger), turns.

Every row carries ``run`` (the run folder) so frames of many runs join on it (a tasks row its run's ``provider`` and
``model`` too); the tasks, turns and calls rows also carry ``task_id`` and ``epoch`` (1 without
``experiment.epochs``; an epochs run has a tasks row per epoch, from ``tasks/<id>/epochs/<n>/``, and its ledger
lines name their epoch). A figure a run did not record is NA, never 0: ``correct`` is a nullable boolean (NA: not
scored), ``cost_usd`` is NA for a task whose calls have no price (or an epoch of a run whose ledger did not name
epochs).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from flowllm.export.ledger import ModelBills, model_bills, read_ledger
from flowllm.export.source import ExportError, RunSource, open_source
from flowllm.export.trace import TaskTrace
from flowllm.rundir.layout import SUMMARY_FILE, TASKS_DIR
from flowllm.rundir.store import local_run

if TYPE_CHECKING:
    import pandas as pd

INSTALL = 'pip install "flowllm[analysis]"'
USAGE_KINDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
MAX_DEPTH = 4  # how deep a sweep folder's runs are looked for (multirun/<date>/<time>/<job>)


class AnalysisUnavailable(ImportError):
    """pandas is not installed; the message is the install command."""


@dataclass
class Frames:
    runs: pd.DataFrame
    tasks: pd.DataFrame
    calls: pd.DataFrame
    turns: pd.DataFrame


def _pandas() -> Any:
    if importlib.util.find_spec("pandas") is None:
        raise AnalysisUnavailable(f"flowllm.analysis needs pandas: {INSTALL}")
    import pandas

    return pandas


def _is_run(path: Path) -> bool:
    return path.is_dir() and ((path / SUMMARY_FILE).is_file() or (path / TASKS_DIR).is_dir())


def find_runs(path: Path | str, depth: int = MAX_DEPTH) -> list[Path]:
    """``path`` when it is a run, else the runs below it (a sweep's job folders), in name order (jobs numerically)."""
    root = local_run(path)  # a store's URL (experiment.store): its local copy
    if _is_run(root):
        return [root]
    if depth <= 0 or not root.is_dir():
        return []
    children = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name),
    )
    return [run for child in children for run in find_runs(child, depth - 1)]


def _flat(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flat(inner, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list):
        out[prefix] = (
            orjson.dumps(value).decode()
            if value and not all(isinstance(v, str) for v in value)
            else (",".join(value) if value else "")
        )
    else:
        out[prefix] = value


def _run_row(source: RunSource) -> dict[str, Any]:
    summary = source.summary
    row: dict[str, Any] = {
        "run": str(source.path),
        "experiment": source.setting("experiment.name"),
        "provider": source.provider,
        "model": source.model,
        "runner": source.setting("runner.name"),
        "repair": source.setting("repair.name"),
        "overrides": " ".join(source.overrides),
        "status": "running or interrupted",
    }
    if summary is None:
        return _with_settings(source, row)
    # An older summary may lack a name: the saved config's stands in (as before the summary had one).
    row["experiment"] = summary.experiment if summary.experiment is not None else row["experiment"]
    row["runner"] = summary.runner if summary.runner is not None else row["runner"]
    row["repair"] = summary.repair if summary.repair is not None else row["repair"]
    row.update(
        status=summary.status,
        tasks=summary.tasks,
        finished=summary.finished,
        completed=summary.completed,
        failed=summary.failed,
        correct=summary.correct,
        accuracy=summary.accuracy,
        cost_usd=summary.cost_usd,
        wall_seconds=summary.wall_seconds,
    )
    if summary.tokens:
        row["tokens_total"] = summary.tokens.get("total")
    # stats: summary.json's accuracy with its uncertainty; fingerprint: kept by older summaries only.
    blocks = {"provenance": summary.provenance, "fingerprint": summary.extra.get("fingerprint")}
    blocks["stats"] = summary.stats.to_dict() if summary.stats is not None else None
    for name, block in blocks.items():
        if isinstance(block, dict) and (block or name == "provenance"):
            _flat(block, name, row)
    return _with_settings(source, row)


def _with_settings(source: RunSource, row: dict[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for group in ("provider", "agent", "experiment", "dataset", "runner", "repair", "recorder"):
        if isinstance(source.setting(group), dict):
            _flat(source.setting(group), f"settings.{group}", settings)
    row.update({k: v for k, v in settings.items() if not isinstance(v, str) or len(v) <= 200})
    return row


def _result_columns(trace: TaskTrace) -> dict[str, Any]:
    """The task row's columns from its result.json; None in each while the task has not finished."""
    result = trace.result
    if result is None:
        return {"status": "unfinished", **dict.fromkeys(_RESULT_COLUMNS)}
    usage = result.usage
    error = result.error
    return {
        "status": result.status,
        "answer": result.answer,
        "truth": result.ground_truth,
        "correct": trace.verdict,  # None (NA) where the tallies count no verdict: a budget's stop among them
        "turns": result.turns,
        "tool_calls": result.tool_calls,
        "bad_tool_calls": result.bad_tool_calls,
        "failed_tool_calls": result.failed_tool_calls,
        **{kind: usage.get(kind) for kind in USAGE_KINDS},
        "tokens_estimated": usage.get("estimated"),
        "stop": result.stop,
        "failure": str(error).splitlines()[0] if error else None,
        "level": result.level,
    }


_RESULT_COLUMNS = (
    *("answer", "truth", "correct", "turns", "tool_calls", "bad_tool_calls", "failed_tool_calls"),
    *USAGE_KINDS,
    *("tokens_estimated", "stop", "failure", "level"),
)


def _task_row(source: RunSource, trace: TaskTrace, bills: ModelBills) -> dict[str, Any]:
    columns = _result_columns(trace)
    row: dict[str, Any] = {
        "run": str(source.path),
        # The run's provider and model on every row: tasks of many runs compare by model without a join.
        "provider": source.provider,
        "model": source.model,
        "task_id": trace.task_id,
        "epoch": trace.epoch,
        "status": columns.pop("status"),
        **{k: columns[k] for k in ("answer", "truth", "correct", "turns", "tool_calls", "bad_tool_calls")},
        "failed_tool_calls": columns["failed_tool_calls"],
        **{kind: columns[kind] for kind in USAGE_KINDS},
        "tokens_estimated": columns["tokens_estimated"],
        "cost_usd": bills.cost(trace.task_id, trace.ledger_epoch, replay=source.replay),
        "wall_seconds": (trace.timing or {}).get("wall_seconds"),
        "stop": columns["stop"],
        "failure": columns["failure"],
        "level": columns["level"],
    }
    categories = trace.result.categories if trace.result is not None else None
    if isinstance(categories, dict):
        row.update({f"category.{k}": v for k, v in categories.items()})
    return row


def _turn_rows(run: str, trace: TaskTrace) -> Iterable[dict[str, Any]]:
    for conv in trace.all_conversations():
        for turn in conv.turns:
            for node in turn.nodes:
                yield {
                    "run": run,
                    "task_id": trace.task_id,
                    "epoch": trace.epoch,
                    "agent": conv.agent,
                    "scope": conv.scope,
                    "turn": turn.number,
                    "node": node.name,
                    "index": node.index,
                    "started_at": node.started_at,
                    "duration_s": node.duration_s,
                    "status": node.status,
                    "error": node.error,
                }


def load(*paths: Path | str) -> Frames:
    """Read run folders (or sweep folders holding runs) into ``Frames``; ``ExportError`` when none is a run."""
    pd = _pandas()
    runs = [run for path in paths for run in find_runs(path)]
    if not runs:
        raise ExportError(f"no flowllm run in {', '.join(str(p) for p in paths) or 'nothing given'}")
    run_rows: list[dict[str, Any]] = []
    task_rows: list[dict[str, Any]] = []
    call_rows: list[dict[str, Any]] = []
    turn_rows: list[dict[str, Any]] = []
    for run_dir in runs:
        source = open_source(run_dir)
        run = str(source.path)
        ledger = read_ledger(source.ledger)
        bills = model_bills(ledger)
        run_rows.append(_run_row(source))
        for trace in source.traces:
            task_rows.append(_task_row(source, trace, bills))
            turn_rows.extend(_turn_rows(run, trace))
        for entry in ledger:
            flat: dict[str, Any] = {"run": run}
            _flat(entry.to_dict(), "", flat)
            call_rows.append(flat)
    tasks = pd.DataFrame(task_rows)
    if not tasks.empty:
        tasks["correct"] = tasks["correct"].astype("boolean")
    turns = pd.DataFrame(turn_rows)
    if not turns.empty:
        turns["started_at"] = pd.to_datetime(turns["started_at"], unit="s", utc=True)
    return Frames(pd.DataFrame(run_rows), tasks, pd.DataFrame(call_rows), turns)
