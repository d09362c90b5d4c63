"""``python -m flowllm.inspect RUN_DIR [summary]``: settings, figures and what went wrong (the default command)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from flowllm.export.contamination import contamination_rows
from flowllm.inspect.artifacts import RunRecord, TaskRecord, is_computed, summary_figures, task_summary
from flowllm.inspect.commands.common import PROG, RunCommand, no_arguments
from flowllm.inspect.commands.render import (
    emit_json,
    esc,
    fmt,
    kv_table,
    pct,
    replay_text,
    seconds,
    status_label,
    status_style,
)
from flowllm.inspect.provenance import provenance_rows
from flowllm.inspect.replay import replay_verdict
from flowllm.inspect.views import Failure, breakdown_rows, run_failures, run_spend, unavailable_tools
from flowllm.run.report import accuracy_rows, acted_row, cost_text, format_usd, headline_accuracy, plural, short_error
from flowllm.run.stats import stats_rows
from flowllm.rundir.layout import LEDGER_FILE
from flowllm.rundir.results import LevelTally, RunSummary
from flowllm.verify import verification

OffReplay = list[tuple[TaskRecord, dict[str, Any]]]


def _tokens_in_out(usage: dict[str, Any]) -> str:
    mark = " (estimated)" if usage.get("estimated") else ""
    return f"{fmt(usage.get('input_tokens'))} / {fmt(usage.get('output_tokens'))}{mark}"


def _spend_rows(figures: RunSummary, spend: dict[str, Any]) -> list[tuple[str, Any]]:
    """Cost and billed tokens: summary.json's cost block, and the ledger's every call (failed tasks included)."""
    rows: list[tuple[str, Any]] = []
    cost = figures.cost
    if cost:
        rows.append(("cost", cost_text(cost)))
    if spend["source"] == LEDGER_FILE:
        spent = format_usd(spend["cost_usd"]) if spend["cost_usd"] is not None else "unpriced"
        mark = " (estimated)" if spend["estimated"] else ""
        split = f"agent {format_usd(spend['agent_cost_usd'])}"
        split += f", judge {format_usd(spend['judge_cost_usd'])}" if spend["judge_cost_usd"] else ""
        rows.append(("billed (every call)", f"{spend['tokens']:,} tokens{mark}, {spent} ({split})"))
    acted = figures.acted
    if isinstance(acted, dict):
        rows.append(("what acted", acted_row(acted)))
    return rows


def _settings(run: RunRecord) -> dict[str, Any]:
    return {**run.main_settings(), "overrides": run.overrides}


def _figure_rows(run: RunRecord, figures: RunSummary) -> list[tuple[str, Any]]:
    usage = figures.usage or {}
    tools = f"{figures.tool_calls} / {figures.bad_tool_calls} / {figures.failed_tool_calls}"
    rows: list[tuple[str, Any]] = [
        *(accuracy_rows(figures) if figures.replay is not None else [("accuracy", headline_accuracy(figures))]),
        *stats_rows(figures),
        *contamination_rows(figures),
        ("completed / failed", f"{figures.completed} / {figures.failed}"),
        ("turns", figures.turns),
        ("tool calls / bad blocks / failed", tools),
        ("parse rate", pct(figures.parse_rate)),
        ("repairs by stage", figures.repairs),
        ("tokens in / out", _tokens_in_out(usage) if usage else None),
        *_spend_rows(figures, run_spend(run)),
        ("wall time", seconds(None if is_computed(run) else figures.wall_seconds)),  # not known from the tasks
        ("verified", verification(run.path).text),
    ]
    if figures.by_level:
        rows.append(
            (
                "by level",
                ", ".join(
                    f"{'no level' if lvl == 'None' else f'L{lvl}'}: {v.correct}/{v.scored_count} scored"
                    for lvl, v in ((lvl, LevelTally.coerce(v)) for lvl, v in figures.by_level.items())
                ),
            )
        )
    if is_computed(run):
        rows.append(("note", "computed from the tasks (summary.json unreadable or missing)"))
    return rows


def breakdown_tables(figures: RunSummary) -> list[Table]:
    """summary.json → breakdown: one table per category field of a judged benchmark (topic, answer type...)."""
    tables = []
    for name, groups in breakdown_rows(figures).items():
        table = Table(title=f"accuracy by {name}", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column(name, overflow="fold")
        table.add_column("correct", justify="right", no_wrap=True)
        table.add_column("accuracy", justify="right", no_wrap=True)
        for g in groups:
            table.add_row(g["value"], f"{fmt(g['correct'])}/{fmt(g['scored'])} scored", pct(g["accuracy"]))
        tables.append(table)
    return tables


def tools_table(tools: dict[str, Any]) -> Table | Text:
    """summary.json → tools.unavailable: the servers (or ``server.tool``) not offered or limited, and why."""
    if not tools["known"]:
        return Text(
            "tool servers unavailable: not known (summary.json has null: a run split over worker processes "
            "does not collect their tool servers; each worker warned about its own)",
            style="yellow",
        )
    table = Table(
        title="tool servers unavailable (not offered, or limited as the reason says)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("server or tool", no_wrap=True, style="yellow")
    table.add_column("why", overflow="fold")
    for server, why in tools["servers"].items():
        table.add_row(server, why)
    return table


def _print_figures(run: RunRecord, console: Console, figures: RunSummary) -> None:
    """The run's settings, figures, provenance, breakdowns, unavailable tools and reading problems."""
    console.print(Panel.fit(f"[bold]{esc(run.path)}[/bold]", title="flowllm run", border_style="cyan"))
    settings = _settings(run)
    console.print(
        kv_table([(k, " ".join(v) if isinstance(v, list) else v) for k, v in settings.items()], title="settings")
    )
    console.print(kv_table(_figure_rows(run, figures), title="figures"))
    origin = provenance_rows(run)
    if origin:
        console.print(kv_table(origin, title="provenance"))
    for table in breakdown_tables(figures):
        console.print(table)
    tools = unavailable_tools(figures)
    if tools is not None:
        console.print(tools_table(tools))
    if run.problems:
        console.print(
            Panel("\n".join(f"- {p}" for p in run.problems), title="problems reading the run", border_style="yellow")
        )


def _print_off_replay(console: Console, off_replay: OffReplay) -> None:
    """A replay's correct answers mean little where the replay parted from the saved run: those tasks, and where."""
    if not off_replay:
        return
    table = Table(title="tasks that did not replay exactly", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("task", no_wrap=True)
    table.add_column("replay", no_wrap=True)
    table.add_column("what changed", overflow="fold")
    for task, verdict in off_replay:
        what = verdict.get("what") or verdict.get("reason") or task.error or ""
        table.add_row(task.task_id, replay_text(verdict), short_error(what))
    console.print(table)


def _print_bad_tasks(run: RunRecord, console: Console, bad_tasks: list[TaskRecord], failures: list[Failure]) -> None:
    table = Table(title="tasks that failed or answered wrong", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("task", no_wrap=True)
    table.add_column("status")
    table.add_column("why", overflow="fold")
    for task in bad_tasks:
        why = next((f.reason for f in failures if f.task_id == task.task_id), task.error or "")
        table.add_row(
            task.task_id,
            Text(status_label(task.status, task.record.limit), style=status_style(task.status, False)),
            why,
        )
    console.print(table)
    where = esc(run.path)
    console.print(f"[dim]details: {PROG} {where} task <task id>   |   every failure: {PROG} {where} failures[/dim]")


def _print_all_correct(run: RunRecord, console: Console, stale: OffReplay) -> None:
    unscored = [t for t in run.tasks if t.status == "completed" and t.correct is None]
    stale_ids = {t.task_id for t, _ in stale}
    no_truth = [t for t in unscored if t.task_id not in stale_ids]
    scored = len(run.tasks) - len(unscored)
    shown = f"{scored} scored" if unscored else str(len(run.tasks))
    console.print(f"[green]all {shown} tasks completed and answered correctly[/green]")
    if no_truth:
        console.print(f"[yellow]{plural(len(no_truth), 'task')} unscored: no ground truth to score against[/yellow]")


def cmd_summary(run: RunRecord, console: Console, as_json: bool) -> int:
    failures = run_failures(run)
    if as_json:
        emit_json(
            {
                "run": str(run.path),
                "settings": _settings(run),
                "summary": task_summary(run),
                "problems": run.problems,
                "failures": [asdict(f) for f in failures],
                "verification": verification(run.path).to_dict(),
            }
        )
        return 0
    _print_figures(run, console, summary_figures(run))
    off_replay = [(t, v) for t in run.tasks if (v := replay_verdict(t)) is not None and v["status"] != "exact"]
    _print_off_replay(console, off_replay)
    bad_tasks = [t for t in run.tasks if t.status != "completed" or t.correct is False]
    stale = [(t, v) for t, v in off_replay if v["status"] != "forked"]  # a forked task's rest was run live
    if bad_tasks:
        _print_bad_tasks(run, console, bad_tasks, failures)
    else:
        _print_all_correct(run, console, stale)
    if stale:
        but = "" if bad_tasks else "but "
        console.print(
            f"[magenta]{but}{plural(len(stale), 'task')} did not replay exactly: the saved replies after the "
            "divergence answered another conversation (unscored)[/magenta]"
        )
    return 0


def _run(run: RunRecord, console: Console, as_json: bool, ns: argparse.Namespace) -> int:
    return cmd_summary(run, console, as_json)


COMMAND = RunCommand("summary", "settings, figures and what went wrong (the default)", no_arguments, _run)
