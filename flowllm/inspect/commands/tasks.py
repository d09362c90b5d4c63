"""``python -m flowllm.inspect RUN_DIR tasks [--status failed] [--level 2] [--replay diverged]``: one line per task."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from flowllm.inspect.artifacts import RunRecord
from flowllm.inspect.commands.common import PROG, RunCommand, UsageError
from flowllm.inspect.commands.render import STATUS_STYLES, emit_json, esc, fmt, replay_text
from flowllm.inspect.replay import REPLAY_STATUSES, is_replay, replay_verdict
from flowllm.inspect.views import ResultRow, first_line, result_row
from flowllm.run.report import format_tokens, format_usd, short_error
from flowllm.scoring.tally import UNFINISHED_STATUS
from flowllm.spend.task_usage import read_bills

TASK_STATUSES = ("failed", "wrong", "correct", "unscored", "completed", "unfinished")


@dataclass
class TaskLine:
    """One line of ``tasks``: the task's result row, what it was billed, and a replay's verdict."""

    row: ResultRow
    billed_tokens: int | None
    cost_usd: float | None
    tokens_estimated: bool
    replayed: bool  # the run was a replay: the line has a verdict (None: the task has none)
    replay: dict[str, Any] | None = None

    @property
    def replay_status(self) -> Any:
        return (self.replay or {}).get("status")

    def to_dict(self) -> dict[str, Any]:
        """The row ``tasks --json`` prints: the result row's fields, the bill, and a replay's verdict."""
        bill = {
            "billed_tokens": self.billed_tokens,
            "cost_usd": self.cost_usd,
            "tokens_estimated": self.tokens_estimated,
        }
        return {**self.row.to_dict(), **bill, **({"replay": self.replay} if self.replayed else {})}


def shown_status(row: ResultRow) -> str:
    """What the status column shows: failed, wrong, correct or unscored (a replayed task that diverged;
    completed = all three), unfinished."""
    if row.status == "completed":
        if row.correct is None:
            return "unscored"
        return "correct" if row.correct else "wrong"
    return str(row.status)


def matches_status(row: ResultRow, wanted: str) -> bool:
    """Whether the row is what ``--status`` asks for: completed is correct + wrong + unscored, and unfinished
    takes in the tasks the run's budget stopped, as the summary counts them."""
    shown = shown_status(row)
    if wanted == "completed":
        return shown in ("correct", "wrong", "unscored")
    return shown == wanted or (wanted == "unfinished" and shown == UNFINISHED_STATUS)


def _rows(run: RunRecord, replayed: bool) -> list[TaskLine]:
    bills = read_bills(run.path)
    rows = []
    for task in run.tasks:
        bill = bills.get(task.task_id)
        rows.append(
            TaskLine(
                result_row(task),
                billed_tokens=bill.total_tokens if bill else None,
                cost_usd=bill.cost_usd if bill else None,
                tokens_estimated=bool(bill and bill.estimated),
                replayed=replayed,  # the verdict of replay_audit.py; a run that was not a replay has no such column
                replay=replay_verdict(task) if replayed else None,
            )
        )
    return rows


def _columns(replayed: bool, spend: bool) -> list[tuple[str, dict[str, Any]]]:
    # Long cells end with an ellipsis so that the table fits the terminal (the full text: `task TASK_ID`).
    cut = {"overflow": "ellipsis", "no_wrap": True}
    return [
        ("task", {**cut, "min_width": 12, "max_width": 30}),
        ("level", {"no_wrap": True, "min_width": 5}),
        ("status", {"no_wrap": True, "min_width": 10}),
        *([("replay", {**cut, "min_width": 10, "max_width": 30})] if replayed else []),
        ("answer", {**cut, "min_width": 10, "max_width": 24}),
        ("expected", {**cut, "min_width": 8, "max_width": 16}),
        ("turns", {"justify": "right", "no_wrap": True, "min_width": 5}),
        ("calls", {"justify": "right", "no_wrap": True, "min_width": 5}),
        ("bad", {"justify": "right", "no_wrap": True, "min_width": 3}),
        *(
            [
                ("tokens", {"justify": "right", "no_wrap": True, "min_width": 8}),
                ("cost", {"justify": "right", "no_wrap": True, "min_width": 8}),
            ]
            if spend
            else []
        ),
        ("repairs", {**cut, "min_width": 8, "max_width": 20}),
        ("error", {**cut, "min_width": 5, "max_width": 40}),
    ]


def _cells(line: TaskLine) -> dict[str, Any]:
    r = line.row
    shown = shown_status(r)
    tokens = line.billed_tokens
    return {
        "task": r.task_id,
        "level": fmt(r.level),
        "status": Text(shown, style=STATUS_STYLES.get(shown, "red")),
        "replay": replay_text(line.replay, cell=True),
        "answer": fmt(r.answer),
        "expected": fmt(r.ground_truth),
        "turns": fmt(r.turns),
        "calls": fmt(r.tool_calls),
        "bad": fmt(r.bad_tool_calls),
        "tokens": format_tokens(tokens, line.tokens_estimated) if tokens is not None else "-",
        "cost": format_usd(line.cost_usd) if tokens is not None else "-",
        "repairs": fmt(r.repairs),
        "error": short_error(first_line(r.error or "", 200)) if r.error else "",
    }


def cmd_tasks(
    run: RunRecord, console: Console, as_json: bool, status: str | None, level: int | None, replay: str | None = None
) -> int:
    replayed = is_replay(run)
    if replay and not replayed:
        raise UsageError(f"{run.path} is not a replay (provider=replay): --replay has nothing to filter")
    rows = _rows(run, replayed)
    if status:
        rows = [r for r in rows if matches_status(r.row, status)]
    if level is not None:
        rows = [r for r in rows if r.row.level == level]
    if replay:
        rows = [r for r in rows if r.replay_status == replay]
    if as_json:
        emit_json([r.to_dict() for r in rows])
        return 0
    table = Table(
        title=f"tasks of {run.path} ({len(rows)} of {len(run.tasks)})", title_justify="left", box=box.SIMPLE_HEAD
    )
    # A replay spends nothing: its tokens and cost columns would be empty, so its verdict takes their place.
    spend = not replayed or any(r.billed_tokens is not None for r in rows)
    columns = _columns(replayed, spend)
    for name, kwargs in columns:
        table.add_column(name, **kwargs)
    for r in rows:
        cells = _cells(r)
        table.add_row(*(cells[name] for name, _ in columns))
    console.print(table)
    if replayed and any(r.replay_status == "diverged" for r in rows):
        console.print(f"[dim]what changed where a task diverged: {PROG} {esc(run.path)} task <task id>[/dim]")
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--status",
        choices=TASK_STATUSES,
        help="completed is wrong + correct + unscored; unfinished takes in the tasks the run's budget stopped",
    )
    parser.add_argument("--level", type=int)
    parser.add_argument("--replay", choices=REPLAY_STATUSES, help="a replay's tasks by verdict (provider=replay runs)")


def _run(run: RunRecord, console: Console, as_json: bool, ns: argparse.Namespace) -> int:
    return cmd_tasks(run, console, as_json, ns.status, ns.level, ns.replay)


COMMAND = RunCommand("tasks", "one line per task", _arguments, _run)
