"""The table printed at the end of a run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def print_summary(
    summary: dict[str, Any], outcomes: Sequence[Any], run_dir: Path, console: Console | None = None
) -> None:
    console = console or Console()
    tasks = Table(title="tasks", show_lines=False)
    for column in ("task", "level", "status", "answer", "expected", "correct", "turns", "tool calls"):
        tasks.add_column(column)
    for o in outcomes:
        mark = "[green]yes" if o.correct else "[red]no"
        answer = o.answer if o.answer is not None else f"[red]{o.error}"
        tasks.add_row(
            o.task_id,
            str(o.level),
            o.status,
            str(answer)[:60],
            str(o.ground_truth)[:40],
            mark,
            str(o.turns),
            str(o.tool_calls),
        )
    console.print(tasks)
    usage = summary["usage"]
    totals = Table(title="summary", show_header=False)
    totals.add_column("what")
    totals.add_column("value")
    rows = [
        ("accuracy", f"{summary['accuracy']:.1%} ({summary['correct']}/{summary['tasks']})"),
        ("completed / failed", f"{summary['completed']} / {summary['failed']}"),
        ("tool calls (bad blocks)", f"{summary['tool_calls']} ({summary['bad_tool_calls']})"),
        ("repairs by stage", ", ".join(f"{k}: {v}" for k, v in summary["repairs"].items()) or "-"),
        ("tokens in / out", f"{usage['input_tokens']:,} / {usage['output_tokens']:,}"),
        ("cache read / write", f"{usage['cache_read_tokens']:,} / {usage['cache_write_tokens']:,}"),
        ("wall time", f"{summary['wall_seconds']:.1f}s"),
        ("run directory", str(run_dir)),
    ]
    if summary.get("interrupted"):
        rows.insert(0, ("[red]interrupted", "[red]yes: rerun with the same hydra.run.dir to resume"))
    for row in rows:
        totals.add_row(*row)
    console.print(totals)
