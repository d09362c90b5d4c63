"""``python -m flowllm.inspect``: a saved run in the terminal.

    python -m flowllm.inspect RUN_DIR                     summary: settings, figures, what went wrong
    python -m flowllm.inspect RUN_DIR tasks [--status failed] [--level 2] [--replay diverged]
    python -m flowllm.inspect RUN_DIR task TASK_ID        turns, tool calls, repairs, errors, the answer
    python -m flowllm.inspect RUN_DIR node TASK TURN NODE [--only input|output|meta] [--raw]
    python -m flowllm.inspect RUN_DIR grep TEXT [--regex]
    python -m flowllm.inspect RUN_DIR failures [--kind bad_tool_call]
    python -m flowllm.inspect diff RUN_A RUN_B [--all]
    python -m flowllm.inspect report RUN_DIR|MULTIRUN_DIR [-o report.html]
    python -m flowllm.inspect usage RUN [RUN...] [--by user,model]   usage ledgers summed across runs
    python -m flowllm.inspect power --baseline 0.6 --delta 0.05 [--epochs 3] [--within-var V] [--run RUN]
    python -m flowllm.inspect export RUN --format inspect|otlp|gaia-submission [-o FILE] [--endpoint URL]  (no --json)

Every command takes ``--json`` (machine-readable output on stdout). Exit status: 0 done, 2 bad input (bad usage,
a folder that is not a run, a task, turn or node the run does not have: flowllm.errors.CliError), 1 a bug.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from flowllm.errors import CliError
from flowllm.inspect.artifacts import MAIN_AGENT, NotARunError, RunRecord, open_run, task_summary
from flowllm.inspect.diff import RunDiff, diff_runs
from flowllm.inspect.paired import NoCommonTasks, paired_block, render_paired
from flowllm.inspect.provenance import provenance_changes, provenance_rows
from flowllm.inspect.views import (
    REPLAY_STATUSES,
    SPEND_SOURCES,
    Failure,
    ReplayDetail,
    breakdown_rows,
    first_line,
    grep_run,
    is_replay,
    readable_media,
    replay_detail,
    replay_label,
    replay_verdict,
    result_row,
    run_failures,
    run_spend,
    task_failures,
    task_turn_views,
    unavailable_tools,
)
from flowllm.run.epochs import epoch_summary
from flowllm.run.report import (
    accuracy_rows,
    acted_row,
    cost_text,
    format_tokens,
    format_usd,
    headline_accuracy,
    plural,
    short_error,
)
from flowllm.run.stats import stats_rows
from flowllm.rundir.layout import LEDGER_FILE
from flowllm.spend.task_usage import read_bills
from flowllm.verify import verification

PROG = "python -m flowllm.inspect"
FAILURE_KINDS = (
    "task_failed",
    "wrong_answer",
    "bad_tool_call",
    "repair_failed",
    "tool_error",
    "node_error",
    "unreadable",
)


class UsageError(CliError):
    """Bad arguments, or a folder that is not a run: exit status 2."""


class NotFound(CliError):
    """A task, turn or node that the run does not have: exit status 2 (bad input)."""


def make_console() -> Console:
    # Piped output (a file, a test, less) would default to 80 columns and squeeze the tables unreadably.
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=140)
    return console


def esc(value: Any) -> str:
    """Data inside a markup string: paths and ids may contain [brackets]."""
    return escape(str(value))


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


# ----- rendering helpers ------------------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
    return str(value)


def status_label(status: str, limit: str | None) -> str:
    """A task's status as shown: a completed one in this table answered wrong; a limited one names its limit."""
    if status == "completed":
        return "wrong"
    return f"{status} ({limit})" if limit else status


def _status_style(status: str, correct: bool | None = None) -> str:
    if status == "completed":
        return "green" if correct or correct is None else "yellow"
    return "red"


def to_yaml(value: Any) -> str:
    """Readable rendering of a JSON value: multi-line strings (code, prompts, replies) as YAML blocks."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110, default_flow_style=False)


def _kv_table(rows: Sequence[tuple[str, Any]], title: str | None = None) -> Table:
    table = Table(box=box.SIMPLE, show_header=False, title=title, title_justify="left", pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        # Text, never a markup string: values are data and may contain [brackets].
        table.add_row(key, value if isinstance(value, Text) else Text(_fmt(value)))
    return table


def _pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _seconds(value: Any) -> str:
    return f"{value:,.1f}s" if isinstance(value, (int, float)) else "-"


def _tokens_in_out(usage: dict[str, Any]) -> str:
    mark = " (estimated)" if usage.get("estimated") else ""
    return f"{_fmt(usage.get('input_tokens'))} / {_fmt(usage.get('output_tokens'))}{mark}"


def _spend_rows(figures: dict[str, Any], spend: dict[str, Any]) -> list[tuple[str, Any]]:
    """Cost and billed tokens: summary.json's cost block, and the ledger's every call (failed tasks included)."""
    rows: list[tuple[str, Any]] = []
    cost = figures.get("cost") or {}
    if cost:
        rows.append(("cost", cost_text(cost)))
    if spend["source"] == LEDGER_FILE:
        spent = format_usd(spend["cost_usd"]) if spend["cost_usd"] is not None else "unpriced"
        mark = " (estimated)" if spend["estimated"] else ""
        split = f"agent {format_usd(spend['agent_cost_usd'])}"
        split += f", judge {format_usd(spend['judge_cost_usd'])}" if spend["judge_cost_usd"] else ""
        rows.append(("billed (every call)", f"{spend['tokens']:,} tokens{mark}, {spent} ({split})"))
    acted = figures.get("acted")
    if isinstance(acted, dict):
        rows.append(("what acted", acted_row(acted)))
    return rows


# ----- commands on one run ----------------------------------------------------------------------------------
def cmd_summary(run: RunRecord, console: Console, as_json: bool) -> int:
    figures = task_summary(run)
    failures = run_failures(run)
    settings = {
        "experiment": run.setting("experiment.name"),
        "provider": run.setting("provider.name"),
        "model": run.setting("provider.model"),
        "protocol": run.setting("provider.protocol"),
        "runner": run.setting("runner.name"),
        "repair": run.setting("repair.name"),
        "overrides": run.overrides,
    }
    if as_json:
        emit_json(
            {
                "run": str(run.path),
                "settings": settings,
                "summary": figures,
                "problems": run.problems,
                "failures": [asdict(f) for f in failures],
                "verification": verification(run.path).to_dict(),
            }
        )
        return 0
    console.print(Panel.fit(f"[bold]{esc(run.path)}[/bold]", title="flowllm run", border_style="cyan"))
    console.print(
        _kv_table([(k, " ".join(v) if isinstance(v, list) else v) for k, v in settings.items()], title="settings")
    )
    usage = figures.get("usage") or {}
    rows: list[tuple[str, Any]] = [
        *(accuracy_rows(figures) if figures.get("replay") is not None else [("accuracy", headline_accuracy(figures))]),
        *stats_rows(figures),
        ("completed / failed", f"{figures.get('completed')} / {figures.get('failed')}"),
        ("turns", figures.get("turns")),
        (
            "tool calls / bad blocks / failed",
            f"{figures.get('tool_calls')} / {figures.get('bad_tool_calls')} / {figures.get('failed_tool_calls')}",
        ),
        ("parse rate", _pct(figures.get("parse_rate"))),
        ("repairs by stage", figures.get("repairs")),
        ("tokens in / out", _tokens_in_out(usage) if usage else None),
        *_spend_rows(figures, run_spend(run)),
        ("wall time", _seconds(figures.get("wall_seconds"))),
        ("verified", verification(run.path).text),
    ]
    if figures.get("by_level"):
        rows.append(
            (
                "by level",
                ", ".join(
                    f"{'no level' if lvl == 'None' else f'L{lvl}'}: "
                    f"{v.get('correct')}/{v.get('scored', v.get('tasks'))} scored"
                    for lvl, v in figures["by_level"].items()
                ),
            )
        )
    if figures.get("computed"):
        rows.append(("note", "computed from the tasks (summary.json unreadable or missing)"))
    console.print(_kv_table(rows, title="figures"))
    origin = provenance_rows(run)
    if origin:
        console.print(_kv_table(origin, title="provenance"))
    for table in breakdown_tables(figures):
        console.print(table)
    tools = unavailable_tools(figures)
    if tools is not None:
        console.print(tools_table(tools))
    if run.problems:
        console.print(
            Panel("\n".join(f"- {p}" for p in run.problems), title="problems reading the run", border_style="yellow")
        )
    # A replay's correct answers mean little where the replay parted from the saved run: those tasks, and where.
    off_replay = [(t, v) for t in run.tasks if (v := replay_verdict(t)) is not None and v["status"] != "exact"]
    if off_replay:
        table = Table(title="tasks that did not replay exactly", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("task", no_wrap=True)
        table.add_column("replay", no_wrap=True)
        table.add_column("what changed", overflow="fold")
        for task, verdict in off_replay:
            what = verdict.get("what") or verdict.get("reason") or task.error or ""
            table.add_row(task.task_id, replay_text(verdict), short_error(what))
        console.print(table)
    bad_tasks = [t for t in run.tasks if t.status != "completed" or t.correct is False]
    unscored = [t for t in run.tasks if t.status == "completed" and t.correct is None]
    stale = [(t, v) for t, v in off_replay if v["status"] != "forked"]  # a forked task's rest was run live
    if bad_tasks:
        table = Table(title="tasks that failed or answered wrong", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("task", no_wrap=True)
        table.add_column("status")
        table.add_column("why", overflow="fold")
        for task in bad_tasks:
            why = next((f.reason for f in failures if f.task_id == task.task_id), task.error or "")
            table.add_row(
                task.task_id,
                Text(status_label(task.status, task.field("limit")), style=_status_style(task.status, False)),
                why,
            )
        console.print(table)
        where = esc(run.path)
        console.print(f"[dim]details: {PROG} {where} task <task id>   |   every failure: {PROG} {where} failures[/dim]")
    else:
        stale_ids = {t.task_id for t, _ in stale}
        no_truth = [t for t in unscored if t.task_id not in stale_ids]
        scored = len(run.tasks) - len(unscored)
        shown = f"{scored} scored" if unscored else str(len(run.tasks))
        console.print(f"[green]all {shown} tasks completed and answered correctly[/green]")
        if no_truth:
            console.print(
                f"[yellow]{plural(len(no_truth), 'task')} unscored: no ground truth to score against[/yellow]"
            )
    if stale:
        but = "" if bad_tasks else "but "
        console.print(
            f"[magenta]{but}{plural(len(stale), 'task')} did not replay exactly: the saved replies after the "
            "divergence answered another conversation (unscored)[/magenta]"
        )
    return 0


def breakdown_tables(figures: dict[str, Any]) -> list[Table]:
    """summary.json → breakdown: one table per category field of a judged benchmark (topic, answer type...)."""
    tables = []
    for name, groups in breakdown_rows(figures).items():
        table = Table(title=f"accuracy by {name}", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column(name, overflow="fold")
        table.add_column("correct", justify="right", no_wrap=True)
        table.add_column("accuracy", justify="right", no_wrap=True)
        for g in groups:
            table.add_row(g["value"], f"{_fmt(g['correct'])}/{_fmt(g['scored'])} scored", _pct(g["accuracy"]))
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


TASK_STATUSES = ("failed", "wrong", "correct", "unscored", "completed", "unfinished")


def shown_status(row: dict[str, Any]) -> str:
    """What the status column shows: failed, wrong, correct or unscored (a replayed task that diverged;
    completed = all three), unfinished."""
    if row["status"] == "completed":
        if row["correct"] is None:
            return "unscored"
        return "correct" if row["correct"] else "wrong"
    return str(row["status"])


def matches_status(row: dict[str, Any], wanted: str) -> bool:
    shown = shown_status(row)
    return shown == wanted or (wanted == "completed" and shown in ("correct", "wrong", "unscored"))


STATUS_STYLES = {"correct": "green", "wrong": "yellow", "unscored": "magenta"}
REPLAY_STYLES = {"exact": "green", "diverged": "magenta", "missing": "red", "unverified": "yellow", "forked": "cyan"}


def replay_text(verdict: dict[str, Any] | None, cell: bool = False) -> Text:
    """A replay verdict, coloured; in a table cell, where it diverged goes on a second line."""
    label = replay_label(verdict)
    if cell:
        label = label.replace(" at ", " at\n", 1)
    return Text(label, style=REPLAY_STYLES.get((verdict or {}).get("status", ""), "dim"))


def cmd_tasks(
    run: RunRecord, console: Console, as_json: bool, status: str | None, level: int | None, replay: str | None = None
) -> int:
    replayed = is_replay(run)
    if replay and not replayed:
        raise UsageError(f"{run.path} is not a replay (provider=replay): --replay has nothing to filter")
    bills = read_bills(run.path)
    rows = []
    for task in run.tasks:
        r = result_row(task)
        bill = bills.get(r["task_id"])
        r["billed_tokens"] = bill.total_tokens if bill else None
        r["cost_usd"] = bill.cost_usd if bill else None
        r["tokens_estimated"] = bool(bill and bill.estimated)
        if replayed:  # the verdict of replay_audit.py; a run that was not a replay has no such column
            r["replay"] = replay_verdict(task)
        rows.append(r)
    if status:
        rows = [r for r in rows if matches_status(r, status)]
    if level is not None:
        rows = [r for r in rows if r["level"] == level]
    if replay:
        rows = [r for r in rows if (r["replay"] or {}).get("status") == replay]
    if as_json:
        emit_json(rows)
        return 0
    table = Table(
        title=f"tasks of {run.path} ({len(rows)} of {len(run.tasks)})", title_justify="left", box=box.SIMPLE_HEAD
    )
    # Long cells end with an ellipsis so that the table fits the terminal (the full text: `task TASK_ID`).
    cut = {"overflow": "ellipsis", "no_wrap": True}
    # A replay spends nothing: its tokens and cost columns would be empty, so its verdict takes their place.
    spend = not replayed or any(r["billed_tokens"] is not None for r in rows)
    columns: list[tuple[str, dict[str, Any]]] = [
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
    for name, kwargs in columns:
        table.add_column(name, **kwargs)
    for r in rows:
        shown = shown_status(r)
        tokens = r["billed_tokens"]
        cells: dict[str, Any] = {
            "task": r["task_id"],
            "level": _fmt(r["level"]),
            "status": Text(shown, style=STATUS_STYLES.get(shown, "red")),
            "replay": replay_text(r.get("replay"), cell=True),
            "answer": _fmt(r["answer"]),
            "expected": _fmt(r["ground_truth"]),
            "turns": _fmt(r["turns"]),
            "calls": _fmt(r["tool_calls"]),
            "bad": _fmt(r["bad_tool_calls"]),
            "tokens": format_tokens(tokens, r["tokens_estimated"]) if tokens is not None else "-",
            "cost": format_usd(r["cost_usd"]) if tokens is not None else "-",
            "repairs": _fmt(r["repairs"]),
            "error": short_error(first_line(r["error"] or "", 200)) if r["error"] else "",
        }
        table.add_row(*(cells[name] for name, _ in columns))
    console.print(table)
    if replayed and any((r["replay"] or {}).get("status") == "diverged" for r in rows):
        console.print(f"[dim]what changed where a task diverged: {PROG} {esc(run.path)} task <task id>[/dim]")
    return 0


def _find_task(run: RunRecord, task_id: str) -> Any:
    try:
        return run.task(task_id)
    except KeyError as exc:
        raise NotFound(exc.args[0]) from None


REPLAY_MEANING = {
    "missing": "the pipeline asked for a reply the saved run never had: the task failed (see its error)",
    "unverified": "the saved run kept no node outputs to compare with (recorder.snapshot=errors or none)",
    "diverged": "the saved replies after this node answered the saved run's conversation, not this one: "
    "the task is not scored (its correct is null)",
    "forked": "the task went live at its first call whose request differed (provider.fork=live): the rest of it "
    "is a live run, scored",
}


def _value_block(value: Any, limit: int | None) -> Any:
    """A JSON value as a person reads it: objects as YAML, a string as its text, anything else as JSON."""
    if isinstance(value, (dict, list)):
        return Syntax(_clip(to_yaml(value), limit).rstrip(), "yaml", word_wrap=True)
    if isinstance(value, str):
        return Text(_clip(value, limit))
    return Text(json.dumps(value))


def _replay_panel(run: RunRecord, task_id: str, detail: ReplayDetail, limit: int | None) -> Panel:
    """What a replay verdict means for the task and, at a divergence, the saved and the new value."""
    rows: list[tuple[str, Any]] = [("verdict", replay_text(replay_verdict(run.task(task_id))))]
    if detail.path:
        at = f" (they differ from character {detail.offset})" if detail.offset else ""
        rows.append(("what changed", Text(f"{detail.node} output, at {detail.path}{at}", style="magenta")))
    elif detail.what:  # the saved values could not be read back: the audit's own description
        rows.append(("what changed", Text(detail.what, style="magenta")))
    parts: list[Any] = [_kv_table(rows)]
    if detail.path:
        for label, value in (("saved run", detail.saved), ("this run", detail.new)):
            parts.append(Text(f"{label}:", style="bold"))
            parts.append(_value_block(value, limit))
    if detail.note:
        parts.append(Text(detail.note, style="yellow"))
    parts.append(Text(REPLAY_MEANING.get(detail.status, ""), style="dim"))
    if detail.folder and detail.turn is not None:
        agent = f" --agent {detail.agent}" if detail.agent != MAIN_AGENT else ""
        parts.append(
            Text(f"the node: {PROG} {run.path} node {task_id} {detail.turn} {detail.folder}{agent}", style="dim")
        )
    if detail.saved_run and Path(detail.saved_run).expanduser().is_dir():
        parts.append(Text(f"against the saved run: {PROG} diff {detail.saved_run} {run.path}", style="dim"))
    return Panel(Group(*parts), title="replay", title_align="left", border_style=REPLAY_STYLES[detail.status])


def row_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def cmd_task(run: RunRecord, console: Console, as_json: bool, task_id: str, full: bool) -> int:
    task = _find_task(run, task_id)
    views = task_turn_views(task)
    failures = task_failures(task, views)
    row = result_row(task)
    replay = replay_detail(run, task)
    if as_json:
        data: dict[str, Any] = {"result": row}
        if replay is not None:
            data["replay"] = replay.to_dict()
        emit_json({**data, "turns": [v.to_dict() for v in views], "failures": [asdict(f) for f in failures]})
        return 0
    limit = None if full else 600
    # The node where the replay parted from the saved run, marked in its turn's timeline.
    diverged_at = (replay.agent, replay.turn, replay.folder) if replay is not None and replay.folder else None
    title = Text.assemble((task.task_id, "bold"), "  ", (row["status"], _status_style(row["status"], row["correct"])))
    console.print(
        Panel(
            _kv_table(
                [
                    ("answer", row["answer"]),
                    ("expected", row["ground_truth"]),
                    (
                        "correct",
                        Text("unscored", style="cyan")
                        if row["correct"] is None and row["status"] == "completed"
                        else Text(_fmt(row["correct"]), style="green" if row["correct"] else "red"),
                    ),
                    ("turns / stop", f"{row['turns']} / {_fmt(row['stop'])}"),
                    ("level", row["level"]),
                    (
                        "tool calls / bad / failed",
                        f"{row['tool_calls']} / {row['bad_tool_calls']} / {row['failed_tool_calls']}",
                    ),
                    ("repairs", row["repairs"]),
                    ("wall time (s)", row["wall_seconds"]),
                    ("error", Text(row["error"], style="red") if row["error"] else None),
                    *([("replay", replay_text(replay_verdict(task)))] if replay is not None else []),
                    *([("epochs", epochs)] if (epochs := epoch_summary(row_dict(task.result.value))) else []),
                ]
            ),
            title=title,
            title_align="left",
            border_style=_status_style(row["status"], row["correct"]),
        )
    )
    for problem in task.problems:
        console.print(f"[yellow]! {esc(problem)}[/yellow]")
    if replay is not None and replay.status != "exact":
        console.print(_replay_panel(run, task.task_id, replay, limit))
    for view in views:
        who = f"turn {view.number}" + (f" (agent {view.agent})" if view.agent != MAIN_AGENT else "")
        parts: list[Any] = []
        timeline = Text()
        for n in view.nodes:
            style = {"ok": "green", "error": "bold red"}.get(n.status, "yellow")
            timeline.append(f"{n.name}", style=style)
            timeline.append(f" {n.duration_s:.3f}s" if n.duration_s is not None else " ?s", style="dim")
            if diverged_at == (view.agent, view.number, n.folder):
                timeline.append(" (replay diverged here)", style="bold magenta")
            timeline.append("  ")
        parts.append(timeline)
        if view.text is not None:
            parts.append(Text("model: ", style="bold").append(_clip(view.text, limit), style=""))
        for call in view.calls:
            line = Text("call ", style="bold")
            line.append(call.label, style="cyan")
            if call.repair_error:
                line.append(f"  arguments NOT repaired: {call.repair_error}", style="red")
            else:
                quiet = call.repair_stage == "strict"  # clean JSON: nothing to look at
                line.append(f"  repair: {call.repair_stage}", style="dim" if quiet else "yellow")
            parts.append(line)
            if call.arguments is not None:
                parts.append(Syntax(_clip(to_yaml(call.arguments), limit).rstrip(), "yaml", word_wrap=True))
            else:
                parts.append(Text(_clip(call.arguments_text, limit), style="dim"))
            if call.result is not None:
                parts.append(
                    Text("result: ", style="bold").append(
                        _clip(call.result, limit), style="red" if call.result_error else ""
                    )
                )
        for bad in view.bad_calls:
            parts.append(Text(f"bad tool call: {bad.reason}", style="bold red"))
            parts.append(Text(_clip(bad.raw, limit), style="dim"))
        for node in view.errors:
            parts.append(Text(f"{node.folder} failed: {node.error}", style="bold red"))
        for problem in view.problems:
            parts.append(Text(f"! {problem}", style="yellow"))
        console.print(
            Panel(
                Group(*parts),
                title=f"{who}  {view.duration_s:.3f}s",
                title_align="left",
                border_style="red" if view.errors or view.bad_calls else "blue",
            )
        )
    if failures:
        console.print(_failure_table(failures, title="what went wrong"))
    console.print(
        f"[dim]a node's input and output: {PROG} {esc(run.path)} node {esc(task.task_id)} <turn> <node>[/dim]"
    )
    return 0


def _clip(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters; --full shows all]"


def cmd_node(
    run: RunRecord,
    console: Console,
    as_json: bool,
    task_id: str,
    turn: str,
    node_key: str,
    agent: str,
    only: str | None,
    raw: bool,
) -> int:
    task = _find_task(run, task_id)
    number_text = turn.removeprefix("turn_").lstrip("0") or "0"
    if not number_text.isdigit():
        raise UsageError(f"turn must be a number (1, 2...) or turn_NNN, not '{turn}'")
    try:
        record = task.turn(int(number_text), agent)
    except KeyError as exc:
        raise NotFound(exc.args[0]) from None
    if record is None:
        known = ", ".join(str(t.number) for t in task.turns_of(agent)) or "none"
        raise NotFound(f"task '{task.task_id}' has no turn {number_text} (turns: {known})")
    node = record.node(node_key)
    if node is None:
        raise NotFound(
            f"turn {record.number} of '{task.task_id}' has no node '{node_key}' "
            f"(nodes: {', '.join(n.folder for n in record.nodes)})"
        )
    parts = {"meta": node.meta, "input": node.input(), "output": node.output()}
    if only:
        parts = {only: parts[only]}
    if as_json:
        emit_json({"path": str(node.path), **{k: a.value if a.ok else {"error": a.error} for k, a in parts.items()}})
        return 0
    console.print(
        Panel.fit(
            f"[bold]{esc(task.task_id)}[/bold] / turn {record.number} / "
            f"[bold]{esc(node.folder)}[/bold]\n"
            f"[dim]{esc(node.path)}[/dim]",
            border_style="cyan",
        )
    )
    for name, artifact in parts.items():
        if not artifact.ok:
            console.print(Panel(Text(artifact.error or "unreadable", style="yellow"), title=name, title_align="left"))
            continue
        value = artifact.value
        if name == "meta" and isinstance(value, dict) and value.get("traceback") and not raw:
            value = {k: v for k, v in value.items() if k != "traceback"}
            body: Any = Group(
                Syntax(to_yaml(value).rstrip(), "yaml", word_wrap=True),
                Text(str(artifact.value["traceback"]).rstrip(), style="red"),
            )
        elif raw:
            body = Syntax(json.dumps(value, indent=2, ensure_ascii=False), "json", word_wrap=True)
        else:  # images and other media as one line each (blobs/ holds the bytes; --raw shows the record as saved)
            body = Syntax(to_yaml(readable_media(value)).rstrip(), "yaml", word_wrap=True)
        console.print(Panel(body, title=name, title_align="left"))
    return 0


def cmd_grep(run: RunRecord, console: Console, as_json: bool, pattern: str, regex: bool, limit: int) -> int:
    hits = grep_run(run, pattern, regex=regex, limit=limit)
    if as_json:
        emit_json([asdict(h) for h in hits])
        return 0
    more = " (limit reached)" if len(hits) >= limit else ""
    table = Table(
        title=f"'{pattern}' in {run.path}: {len(hits)} hit(s){more}", title_justify="left", box=box.SIMPLE_HEAD
    )
    for name in ("task", "turn", "node", "file", "where", "text", "repeated in"):
        table.add_column(name, overflow="fold", no_wrap=name == "task")
    for h in hits:
        turn = "-" if h.turn is None else (str(h.turn) if h.agent == MAIN_AGENT else f"{h.agent}:{h.turn}")
        again = f"{plural(h.repeats, 'later node')} of the turn" if h.repeats else "-"
        table.add_row(h.task_id, turn, h.node or "-", h.file, h.path, h.snippet, again)
    console.print(table)
    repeated = sum(h.repeats for h in hits)
    if repeated:  # every node's input carries the history so far: the same text, node after node
        console.print(
            f"[dim]each match is listed once per turn, at the first node that holds it; "
            f"{plural(repeated, 'repeat')} in later nodes folded (--json: repeated_in)[/dim]"
        )
    return 0


def _failure_table(failures: list[Failure], title: str) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("kind", no_wrap=True)
    table.add_column("where", overflow="fold")
    table.add_column("reason", overflow="fold")
    for f in failures:
        style = "yellow" if f.kind in ("wrong_answer", "unreadable") else "red"
        table.add_row(Text(f.kind, style=style), f.where, f.reason)
    return table


def cmd_failures(run: RunRecord, console: Console, as_json: bool, kind: str | None) -> int:
    failures = run_failures(run)
    if kind:
        failures = [f for f in failures if f.kind == kind]
    if as_json:
        emit_json([asdict(f) for f in failures])
        return 0
    if not failures:
        console.print("[green]nothing failed[/green]")
        return 0
    console.print(_failure_table(failures, title=f"failures in {run.path} ({len(failures)})"))
    return 0


# ----- diff and report ---------------------------------------------------------------------------------------
def _change(a: float | None, b: float | None, money: bool = False) -> str:
    if a is None or b is None:
        return "-"
    delta = b - a
    shown = format_usd(abs(delta)) if money else f"{abs(delta):,.0f}"
    # The sign of what is shown: costs summed from rounded per-call figures differ in the sixth decimal.
    same = shown == (format_usd(0.0) if money else "0")
    sign = "±" if same else "+" if delta > 0 else "-"
    pct = f" ({delta / a:+.1%})" if a else ""
    return f"{sign}{shown}{pct}"


def spend_table(a: dict[str, Any], b: dict[str, Any]) -> Table:
    table = Table(title="spend", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("", "A", "B", "change"):
        table.add_column(name, justify="right" if name else "left")
    table.add_row(
        "tokens (billed)",
        format_tokens(a["tokens"], a["estimated"]),
        format_tokens(b["tokens"], b["estimated"]),
        _change(a["tokens"], b["tokens"]),
    )
    table.add_row(
        "cost", format_usd(a["cost_usd"]), format_usd(b["cost_usd"]), _change(a["cost_usd"], b["cost_usd"], True)
    )
    if a["source"] != LEDGER_FILE or b["source"] != LEDGER_FILE:
        table.add_row("counted from", SPEND_SOURCES[a["source"]], SPEND_SOURCES[b["source"]], "")
    return table


def cmd_diff(a_path: str, b_path: str, console: Console, as_json: bool, show_all: bool) -> int:
    a, b = _open(a_path), _open(b_path)
    result = diff_runs(a, b)
    spend_a, spend_b = run_spend(a), run_spend(b)
    try:
        paired, paired_json = paired_block(a, b)
    except NoCommonTasks as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        differs = {k: {"a": x, "b": y} for k, (x, y) in provenance_changes(a, b).items()}
        emit_json(
            {"provenance": differs, **result.to_dict(), "spend": {"a": spend_a, "b": spend_b}, "paired": paired_json}
        )
        return 0
    console.print(
        Panel.fit(f"A: [bold]{esc(a.path)}[/bold]\nB: [bold]{esc(b.path)}[/bold]", title="diff", border_style="cyan")
    )
    # What produced the numbers first: versions, commit, dataset and price hashes, result-changing settings.
    origin = provenance_changes(a, b)
    if origin:
        console.print(
            _kv_table(
                [(k, f"{_fmt(x)} -> {_fmt(y)}") for k, (x, y) in origin.items()],
                title="provenance and settings that differ",
            )
        )
    console.print(spend_table(spend_a, spend_b))
    if result.settings_changes:
        console.print(
            _kv_table(
                [(k, f"{_fmt(x)} -> {_fmt(y)}") for k, (x, y) in result.settings_changes.items()],
                title="settings that differ",
            )
        )
    if result.summary_changes:
        console.print(
            _kv_table(
                [(k, f"{_fmt(x)} -> {_fmt(y)}") for k, (x, y) in result.summary_changes.items()],
                title="figures that differ",
            )
        )
    if result.replay is not None:
        console.print(replay_table(*result.replay))
    render_paired(console, paired, paired_json)
    if not result.tasks:
        console.print(f"[green]no task differs ({len(result.unchanged)} compared)[/green]")
        if result.replay is not None:
            console.print(replay_line(result))
        return 0
    for t in result.tasks:
        if t.only_in:
            console.print(f"[yellow]{esc(t.task_id)}[/yellow]: only in {t.only_in}")
            continue
        rows: list[tuple[str, Any]] = [(k, f"{_fmt(x)} -> {_fmt(y)}") for k, (x, y) in t.changes.items()]
        rows += [("tool calls", c) for c in t.call_changes]
        if t.replay is not None:
            rows.append(("replay", replay_pair(*t.replay, differs=t.replay_differs)))
        if t.divergence:
            rows.append(("first divergence", Text(t.divergence.describe(), style="magenta")))
        title = Text(t.task_id)
        if t.replay_differs:
            title.append("  replay verdict differs", style="bold magenta")
        border = "magenta" if t.replay_differs else "yellow"
        console.print(Panel(_kv_table(rows), title=title, title_align="left", border_style=border))
    console.print(
        f"{len(result.tasks)} task(s) differ, {len(result.unchanged)} unchanged"
        + (f": {', '.join(result.unchanged)}" if show_all and result.unchanged else "")
    )
    if result.replay is not None:
        console.print(replay_line(result))
    return 0


def _replay_side(counts: dict[str, Any] | None) -> str:
    if counts is None:
        return "not a replay"
    shown = [s for s in REPLAY_STATUSES if s not in ("unverified", "forked") or counts[s] or counts.get("fork")]
    return ", ".join(f"{counts[s]} {s}" for s in shown)


def replay_line(result: RunDiff) -> Text:
    """The diff's closing line for replays: both sides' counts, and how many tasks' verdicts differ."""
    assert result.replay is not None
    line = Text(f"replay: A {_replay_side(result.replay[0])}; B {_replay_side(result.replay[1])}")
    if result.replay_differs:
        line.append(f"; verdict differs for {plural(len(result.replay_differs), 'task')}", style="bold magenta")
    return line


def replay_pair(a: dict[str, Any] | None, b: dict[str, Any] | None, differs: bool) -> Text:
    """Both sides' verdicts of one task: ``A exact, B diverged at turn 1 / repair_arguments``."""
    text = Text("A ").append_text(replay_text(a) if a is not None else Text("not a replay", style="dim"))
    text.append(", B ").append_text(replay_text(b) if b is not None else Text("not a replay", style="dim"))
    if differs:
        text.append("  (differs)", style="bold magenta")
    return text


def replay_table(a: dict[str, Any] | None, b: dict[str, Any] | None) -> Table:
    """Each side's replay counts and its accuracy on exact replays and on all tasks."""
    table = Table(title="replay", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("", "A", "B"):
        table.add_column(name, justify="right" if name else "left")

    def cell(counts: dict[str, Any] | None, key: str) -> str:
        if counts is None:
            return "not a replay" if key == "exact" else "-"
        if key == "accuracy_exact":
            return f"{_pct(counts[key])} ({counts['exact_correct']}/{counts['exact']})"
        if key == "accuracy_scored":
            return f"{_pct(counts[key])} ({counts['scored_correct']}/{counts['scored']})"
        if key.startswith("fork."):
            fork = counts.get("fork")
            if fork is None:
                return "-"
            value = fork.get(key.removeprefix("fork."))
            return "not known" if value is None else f"${float(value):.4f}"
        return str(counts[key])

    forks = any(c is not None and c.get("fork") is not None for c in (a, b))
    for key, label in (
        *((s, s) for s in REPLAY_STATUSES),
        ("unscored", "unscored"),
        ("accuracy_exact", "accuracy (exact replays)"),
        ("accuracy_scored", "accuracy (scored: exact + forked)"),
        *(
            (
                ("fork.live_cost_usd", "fork: live spent"),
                ("fork.full_rerun_cost_usd", "fork: full live re-run"),
                ("fork.saved_usd", "fork: saved"),
            )
            if forks
            else ()
        ),
    ):
        table.add_row(label, cell(a, key), cell(b, key))
    return table


def cmd_report(path: str, output: str | None, max_chars: int, console: Console, as_json: bool) -> int:
    from flowllm.inspect.report import write_report

    target = Path(path).expanduser()
    try:
        written, info = write_report(target, Path(output) if output else None, max_chars=max_chars)
    except NotARunError as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        emit_json({"report": str(written), **info})
    else:
        size = f"{info['bytes'] / 1024:.0f} KB"
        console.print(
            f"report written: [bold]{esc(written)}[/bold] ({size}, {info['runs']} run(s), "
            f"{info['tasks']} task(s)); open it in any browser, no server needed"
        )
    return 0


def _open(path: str) -> RunRecord:
    try:
        return open_run(path)
    except NotARunError as exc:
        raise UsageError(str(exc)) from None


# ----- argument parsing ----------------------------------------------------------------------------------------
def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{PROG} RUN_DIR", description="Look at a saved flowllm run.")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("summary", help="settings, figures and what went wrong (the default)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    p = sub.add_parser("tasks", help="one line per task")
    p.add_argument("--status", choices=TASK_STATUSES, help="completed is wrong + correct + unscored")
    p.add_argument("--level", type=int)
    p.add_argument("--replay", choices=REPLAY_STATUSES, help="a replay's tasks by verdict (provider=replay runs)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    p = sub.add_parser("task", help="one task: turns, tool calls, repairs, errors, the answer")
    p.add_argument("task_id")
    p.add_argument("--full", action="store_true", help="do not shorten long texts")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    p = sub.add_parser("node", help="one node's input, output and meta")
    p.add_argument("task_id")
    p.add_argument("turn")
    p.add_argument("node", help="call_model, 03 or 03_call_model")
    p.add_argument("--agent", default=MAIN_AGENT, help="a sub-agent's name (default: the main agent)")
    p.add_argument("--only", choices=("input", "output", "meta"))
    p.add_argument(
        "--raw", action="store_true", help="JSON as saved instead of the readable form (media as one line each)"
    )
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    p = sub.add_parser("grep", help="find text in every artifact of the run (case-insensitive)")
    p.add_argument("pattern")
    p.add_argument("--regex", action="store_true")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    p = sub.add_parser("failures", help="every failed task, bad tool call, failed repair and tool error")
    p.add_argument("--kind", choices=FAILURE_KINDS)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    console = make_console()
    try:
        if not args or args[0] in ("-h", "--help"):
            sys.stdout.write((__doc__ or "").split("\n\n", 1)[1])
            return 0 if args else 2
        if args[0] == "diff":
            parser = argparse.ArgumentParser(prog=f"{PROG} diff", description="Compare two runs task by task.")
            parser.add_argument("run_a")
            parser.add_argument("run_b")
            parser.add_argument("--all", action="store_true", help="also name the unchanged tasks")
            parser.add_argument("--json", action="store_true")
            ns = parser.parse_args(args[1:])
            return cmd_diff(ns.run_a, ns.run_b, console, ns.json, ns.all)
        if args[0] == "report":
            parser = argparse.ArgumentParser(prog=f"{PROG} report", description="Write a self-contained HTML report.")
            parser.add_argument("path", help="a run directory or a multirun directory")
            parser.add_argument("-o", "--output", help="the HTML file (default: <dir>/report.html)")
            parser.add_argument(
                "--max-chars", type=int, default=20000, help="longest text kept per value in the report (default 20000)"
            )
            parser.add_argument("--json", action="store_true")
            ns = parser.parse_args(args[1:])
            return cmd_report(ns.path, ns.output, ns.max_chars, console, ns.json)
        if args[0] == "usage":
            from flowllm.inspect.usage import main as usage_main

            return usage_main(args[1:], console)
        if args[0] == "power":
            from flowllm.inspect.power import main as power_main

            return power_main(args[1:], console)
        if (
            args[0] == "export"
        ):  # Inspect AI logs, OpenTelemetry spans, GAIA submissions (flowllm/inspect/export_command.py)
            from flowllm.inspect.export_command import run_export

            return run_export(args[1:], console)
        run_path, rest = args[0], args[1:]
        ns = _run_parser().parse_args(rest)
        run = _open(run_path)
        as_json = bool(ns.json)
        command = ns.command or "summary"
        if command == "summary":
            return cmd_summary(run, console, as_json)
        if command == "tasks":
            return cmd_tasks(run, console, as_json, ns.status, ns.level, ns.replay)
        if command == "task":
            return cmd_task(run, console, as_json, ns.task_id, ns.full)
        if command == "node":
            return cmd_node(run, console, as_json, ns.task_id, ns.turn, ns.node, ns.agent, ns.only, ns.raw)
        if command == "grep":
            return cmd_grep(run, console, as_json, ns.pattern, ns.regex, ns.limit)
        if command == "failures":
            return cmd_failures(run, console, as_json, ns.kind)
        raise UsageError(f"unknown command '{command}'")
    except CliError as exc:  # bad input (a missing run, task or turn...): one line, the code the error carries
        print(f"flowllm.inspect: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `... | head` closed the pipe: not an error worth a traceback
        return 0
