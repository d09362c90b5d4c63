"""The tables printed at the end of a run (rich): one row per task, then the run's summary."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flowllm.experiment.task_usage import TaskBill

# Beyond this many tasks the per-task table shows only the ones worth a look (wrong or failed).
MAX_TASK_ROWS = 40
# A cell wraps; past this many characters it ends with an ellipsis (the full text is in result.json).
MAX_CELL_CHARS = 300


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


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


# Error texts start with the exception's class ("ProviderCallError: local: ..."): the class says nothing the
# status column does not, and it ate a third of the column.
_ERROR_PREFIX = re.compile(r"^(?:[A-Z]\w*(?:Error|Exception)): ")


def short_error(error: str | None) -> str:
    return _ERROR_PREFIX.sub("", (error or "").strip(), count=1) or "failed"


def format_tokens(count: int | None, estimated: bool = False) -> str:
    if count is None:
        return "-"
    return f"~{count:,}" if estimated else f"{count:,}"


def task_table(outcomes: Sequence[Any], bills: Mapping[str, TaskBill] | None = None) -> Table:
    shown = list(outcomes)
    title = "tasks"
    if len(shown) > MAX_TASK_ROWS:
        shown = [o for o in shown if not o.correct][:MAX_TASK_ROWS]
        title = f"tasks not solved ({len(shown)} shown of {sum(1 for o in outcomes if not o.correct)})"
    bills = bills or {}
    table = Table(title=title, show_lines=False)
    table.add_column("task", overflow="fold")
    for column in ("level", "status"):
        table.add_column(column)
    # Answers and errors wrap inside their column (up to a few lines) instead of being cut at a fixed width.
    table.add_column("answer", overflow="fold", ratio=3, min_width=20)
    table.add_column("expected", overflow="fold", ratio=1, min_width=8)
    for column in ("correct", "turns", "tool calls", "tokens", "cost"):
        table.add_column(column, justify="right" if column in ("turns", "tool calls", "tokens", "cost") else "left")
    for o in shown:
        mark = "[green]yes" if o.correct else "[red]no"
        if o.answer is not None:
            answer = escape(str(o.answer)[:MAX_CELL_CHARS])
        else:
            answer = f"[red]{escape(short_error(o.error)[:MAX_CELL_CHARS])}"
        attempts = f" ({o.attempts} tries)" if getattr(o, "attempts", 1) > 1 else ""
        bill = bills.get(o.task_id)
        # Billed tokens come from the ledger (failed tasks' calls were paid for too); the result's usage otherwise.
        tokens = format_tokens(bill.total_tokens, bill.estimated) if bill else format_tokens(o.usage.total_tokens)
        cost = format_usd(bill.cost_usd) if bill else "-"
        table.add_row(
            o.task_id,
            str(o.level),
            o.status + attempts,
            answer,
            escape(str(o.ground_truth)[:MAX_CELL_CHARS]),
            mark,
            str(o.turns),
            str(o.tool_calls),
            tokens,
            cost,
        )
    return table


def accuracy_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The accuracy line, and for a replay the exact/diverged counts it is scored on (replay_audit.py)."""
    replay = summary.get("replay")
    if replay is None:
        return [("accuracy", f"{summary['accuracy']:.1%} ({summary['correct']}/{summary['tasks']})")]
    else:
        # A replay is scored on the tasks that replayed exactly; the others' replies answered another conversation.
        exact = replay.get("exact", 0)
        acc = summary.get("accuracy")
        shown = f"{acc:.1%} ({replay.get('exact_correct', 0)}/{exact} exact replays)" if acc is not None else "unknown"
        return [
            ("accuracy", shown if exact else "unknown: no task replayed exactly"),
            (
                "replay",
                f"{exact} exact, {replay.get('diverged', 0)} diverged, {replay.get('missing', 0)} missing, "
                f"{replay.get('unverified', 0)} unverified (all tasks: {summary['correct']}/{summary['tasks']} "
                "correct)",
            ),
        ]


def summary_rows(summary: dict[str, Any], run_dir: Path | None = None) -> list[tuple[str, str]]:
    usage = summary["usage"]
    tokens = summary.get("tokens", {})
    rows = accuracy_rows(summary)
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
        rows.append(("resumed", f"{plural(summary['resumed'], 'task')} already completed by an earlier run"))
    made = summary.get("tool_calls_made", summary["tool_calls"] + summary["bad_tool_calls"])
    parsed = summary.get("tool_calls_parsed", summary["tool_calls"])
    rate = f" ({summary['parse_rate']:.1%})" if summary.get("parse_rate") is not None else ""
    rows.append(("tool calls made / parsed", f"{made} / {parsed}{rate}"))
    rows.append(("repairs by stage", ", ".join(f"{k}: {v}" for k, v in summary["repairs"].items()) or "-"))
    # Estimated counts (a server that reported none) are flagged on every token row, priced or not.
    estimated = " [yellow](estimated)[/yellow]" if usage.get("estimated") else ""
    rows.append(
        (
            "tokens in (uncached) / out",
            f"{usage['input_tokens']:,} ({tokens.get('input_uncached', usage['input_tokens']):,}) / "
            f"{usage['output_tokens']:,}{estimated}",
        )
    )
    billed = (summary.get("providers") or {}).get("usage") or {}
    if (
        billed
        and billed.get("input_tokens", 0) + billed.get("output_tokens", 0)
        != usage["input_tokens"] + usage["output_tokens"]
    ):
        flag = " [yellow](estimated)[/yellow]" if billed.get("estimated") else ""
        rows.append(
            (
                "billed tokens in / out",
                f"{billed.get('input_tokens', 0):,} / {billed.get('output_tokens', 0):,} "
                f"(every call, failed tasks included){flag}",
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
    if summary.get("acted") is not None:
        rows.append(("what acted", acted_row(summary["acted"])))
    rows.append(("wall time", f"{summary['wall_seconds']:.1f}s"))
    if run_dir is not None:
        rows.append(("run directory", str(run_dir)))
    if summary.get("interrupted"):
        rows.insert(0, ("[red]interrupted", "[red]yes: rerun with the same hydra.run.dir to resume"))
    return rows


def what_acted(providers: Mapping[str, Any], outcomes: Sequence[Any]) -> dict[str, Any]:
    """The resilience and agent features that did something in this run, from the ledger and the results."""
    by_agent = providers.get("by_agent") or {}
    breaker = providers.get("breaker_transitions") or {}
    return {
        "retries": int(providers.get("retries") or 0),
        "fallbacks": int(providers.get("fallbacks_taken") or 0),
        "breaker_opened": sum(1 for events in breaker.values() for e in events if e.get("to") == "open"),
        "failed_calls": int(providers.get("calls_failed") or 0),
        # model calls made for other agents than the main one: sub-agents, the compaction summariser
        "other_agent_calls": {
            name: int(tally.get("attempts") or 0) for name, tally in sorted(by_agent.items()) if name != "main"
        },
        "repairs": sum(sum((getattr(o, "repairs", None) or {}).values()) for o in outcomes),
        "pass_at_k_retries": sum(max(0, getattr(o, "attempts", 1) - 1) for o in outcomes),
    }


def acted_row(acted: Mapping[str, Any]) -> str:
    parts = []
    for key, word in (("retries", "retry"), ("fallbacks", "fallback"), ("breaker_opened", "breaker opening")):
        if acted.get(key):
            parts.append(plural(int(acted[key]), word).replace("retrys", "retries"))
    for agent, calls in (acted.get("other_agent_calls") or {}).items():
        parts.append(f"{plural(int(calls), 'call')} by {agent}")
    if acted.get("pass_at_k_retries"):
        parts.append(f"{plural(int(acted['pass_at_k_retries']), 'extra attempt')} (pass@k)")
    return ", ".join(parts) or "nothing (no retries, fallbacks or other agents)"


def print_summary(
    summary: dict[str, Any],
    outcomes: Sequence[Any],
    run_dir: Path,
    console: Console | None = None,
    bills: Mapping[str, TaskBill] | None = None,
) -> None:
    console = console or make_console()
    if outcomes:
        console.print(task_table(outcomes, bills))
    totals = Table(title="summary", show_header=False)
    totals.add_column("what")
    totals.add_column("value")
    for row in summary_rows(summary, run_dir):
        totals.add_row(*row)
    console.print(totals)
