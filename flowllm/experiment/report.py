"""The tables printed at the end of a run (rich): one row per task, then the run's summary."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

# Beyond this many tasks the per-task table shows only the ones worth a look (wrong or failed).
MAX_TASK_ROWS = 40


def make_console() -> Console:
    """The console for end-of-run tables; piped to a file or a log it is wide enough not to wrap every cell."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)
    return console


def format_usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def task_table(outcomes: Sequence[Any]) -> Table:
    shown = list(outcomes)
    title = "tasks"
    if len(shown) > MAX_TASK_ROWS:
        shown = [o for o in shown if not o.correct][:MAX_TASK_ROWS]
        title = f"tasks not solved ({len(shown)} shown of {sum(1 for o in outcomes if not o.correct)})"
    table = Table(title=title, show_lines=False)
    for column in ("task", "level", "status", "answer", "expected", "correct", "turns", "tool calls"):
        table.add_column(column)
    for o in shown:
        mark = "[green]yes" if o.correct else "[red]no"
        answer = o.answer if o.answer is not None else f"[red]{o.error}"
        attempts = f" ({o.attempts} tries)" if getattr(o, "attempts", 1) > 1 else ""
        table.add_row(
            o.task_id,
            str(o.level),
            o.status + attempts,
            str(answer)[:60],
            str(o.ground_truth)[:40],
            mark,
            str(o.turns),
            str(o.tool_calls),
        )
    return table


def summary_rows(summary: dict[str, Any], run_dir: Path | None = None) -> list[tuple[str, str]]:
    usage = summary["usage"]
    tokens = summary.get("tokens", {})
    replay = summary.get("replay")
    if replay is None:
        rows = [("accuracy", f"{summary['accuracy']:.1%} ({summary['correct']}/{summary['tasks']})")]
    else:
        # A replay is scored on the tasks that replayed exactly; the others' replies answered another conversation.
        exact = replay.get("exact", 0)
        acc = summary.get("accuracy")
        shown = f"{acc:.1%} ({replay.get('exact_correct', 0)}/{exact} exact replays)" if acc is not None else "unknown"
        rows = [
            ("accuracy", shown if exact else "unknown: no task replayed exactly"),
            (
                "replay",
                f"{exact} exact, {replay.get('diverged', 0)} diverged, {replay.get('missing', 0)} missing, "
                f"{replay.get('unverified', 0)} unverified (all tasks: {summary['correct']}/{summary['tasks']} "
                "correct)",
            ),
        ]
    for level, data in summary.get("by_level", {}).items():
        name = "no level" if level == "None" else f"level {level}"
        rows.append((f"  {name}", f"{data['accuracy']:.1%} ({data['correct']}/{data['tasks']})"))
    if summary.get("attempts", 1) > 1:
        rows.append(("attempts (pass@k)", f"k={summary['attempts']}, {summary.get('attempts_used', 0)} run"))
    finished = f"{summary['completed']} / {summary['failed']}"
    if summary.get("unfinished"):
        finished += f" ({summary['unfinished']} unfinished)"
    rows.append(("completed / failed", finished))
    if summary.get("resumed"):
        rows.append(("resumed", f"{summary['resumed']} tasks already completed by an earlier run"))
    made = summary.get("tool_calls_made", summary["tool_calls"] + summary["bad_tool_calls"])
    parsed = summary.get("tool_calls_parsed", summary["tool_calls"])
    rate = f" ({summary['parse_rate']:.1%})" if summary.get("parse_rate") is not None else ""
    rows.append(("tool calls made / parsed", f"{made} / {parsed}{rate}"))
    rows.append(("repairs by stage", ", ".join(f"{k}: {v}" for k, v in summary["repairs"].items()) or "-"))
    rows.append(
        (
            "tokens in (uncached) / out",
            f"{usage['input_tokens']:,} ({tokens.get('input_uncached', usage['input_tokens']):,}) / "
            f"{usage['output_tokens']:,}",
        )
    )
    rows.append(("cache read / write", f"{usage['cache_read_tokens']:,} / {usage['cache_write_tokens']:,}"))
    if usage.get("reasoning_tokens"):
        rows.append(("reasoning (part of out)", f"{usage['reasoning_tokens']:,}"))
    cost = summary.get("cost") or {}
    if cost.get("total_usd") is not None:
        estimated = " (estimated token counts)" if cost.get("estimated_tokens") else ""
        rows.append(("cost", f"{format_usd(cost['total_usd'])} ({cost.get('model')}){estimated}"))
    elif cost:
        rows.append(("cost", f"- ({cost.get('note')})"))
    rows.append(("wall time", f"{summary['wall_seconds']:.1f}s"))
    if run_dir is not None:
        rows.append(("run directory", str(run_dir)))
    if summary.get("interrupted"):
        rows.insert(0, ("[red]interrupted", "[red]yes: rerun with the same hydra.run.dir to resume"))
    return rows


def print_summary(
    summary: dict[str, Any], outcomes: Sequence[Any], run_dir: Path, console: Console | None = None
) -> None:
    console = console or make_console()
    if outcomes:
        console.print(task_table(outcomes))
    totals = Table(title="summary", show_header=False)
    totals.add_column("what")
    totals.add_column("value")
    for row in summary_rows(summary, run_dir):
        totals.add_row(*row)
    console.print(totals)
