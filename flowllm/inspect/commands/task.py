"""``python -m flowllm.inspect RUN_DIR task TASK_ID [--full]``: turns, tool calls, repairs, errors, the answer."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from flowllm.inspect.artifacts import MAIN_AGENT, RunRecord, TaskRecord
from flowllm.inspect.commands.common import PROG, RunCommand, find_task
from flowllm.inspect.commands.render import (
    REPLAY_STYLES,
    clip,
    emit_json,
    esc,
    failure_table,
    fmt,
    kv_table,
    replay_text,
    status_style,
    to_yaml,
)
from flowllm.inspect.replay import ReplayDetail, replay_detail, replay_verdict
from flowllm.inspect.views import CallView, ResultRow, TurnView, result_row, task_failures, task_turn_views
from flowllm.run.epochs import epoch_summary

REPLAY_MEANING = {
    "missing": "the pipeline asked for a reply the saved run never had: the task failed (see its error)",
    "unverified": "the saved run kept no node outputs to compare with (recorder.snapshot=errors or none)",
    "diverged": "the saved replies after this node answered the saved run's conversation, not this one: "
    "the task is not scored (its correct is null)",
    "forked": "the task went live at its first call whose request differed (provider.fork=live): the rest of it "
    "is a live run, scored",
}
# Where a replay parted from the saved run: (agent, turn, node folder).
DivergedAt = tuple[str, int | None, str | None]


def _value_block(value: Any, limit: int | None) -> Any:
    """A JSON value as a person reads it: objects as YAML, a string as its text, anything else as JSON."""
    if isinstance(value, (dict, list)):
        return Syntax(clip(to_yaml(value), limit).rstrip(), "yaml", word_wrap=True)
    if isinstance(value, str):
        return Text(clip(value, limit))
    return Text(json.dumps(value))


def _replay_panel(run: RunRecord, task_id: str, detail: ReplayDetail, limit: int | None) -> Panel:
    """What a replay verdict means for the task and, at a divergence, the saved and the new value."""
    rows: list[tuple[str, Any]] = [("verdict", replay_text(replay_verdict(run.task(task_id))))]
    if detail.path:
        at = f" (they differ from character {detail.offset})" if detail.offset else ""
        rows.append(("what changed", Text(f"{detail.node} output, at {detail.path}{at}", style="magenta")))
    elif detail.what:  # the saved values could not be read back: the audit's own description
        rows.append(("what changed", Text(detail.what, style="magenta")))
    parts: list[Any] = [kv_table(rows)]
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


def _task_panel(task: TaskRecord, row: ResultRow, replay: ReplayDetail | None) -> Panel:
    """The task's answer, score, counts and error, under its id and status."""
    title = Text.assemble((task.task_id, "bold"), "  ", (row.status, status_style(row.status, row.correct)))
    return Panel(
        kv_table(
            [
                ("answer", row.answer),
                ("expected", row.ground_truth),
                (
                    "correct",
                    Text("unscored", style="cyan")
                    if row.correct is None and row.status == "completed"
                    else Text(fmt(row.correct), style="green" if row.correct else "red"),
                ),
                ("turns / stop", f"{row.turns} / {fmt(row.stop)}"),
                ("level", row.level),
                (
                    "tool calls / bad / failed",
                    f"{row.tool_calls} / {row.bad_tool_calls} / {row.failed_tool_calls}",
                ),
                ("repairs", row.repairs),
                ("wall time (s)", row.wall_seconds),
                ("error", Text(row.error, style="red") if row.error else None),
                *([("replay", replay_text(replay_verdict(task)))] if replay is not None else []),
                *([("epochs", epochs)] if (epochs := epoch_summary(task.record)) else []),
            ]
        ),
        title=title,
        title_align="left",
        border_style=status_style(row.status, row.correct),
    )


def _timeline(view: TurnView, diverged_at: DivergedAt | None) -> Text:
    """The turn's nodes in order, coloured by status, with their durations."""
    timeline = Text()
    for n in view.nodes:
        style = {"ok": "green", "error": "bold red"}.get(n.status, "yellow")
        timeline.append(f"{n.name}", style=style)
        timeline.append(f" {n.duration_s:.3f}s" if n.duration_s is not None else " ?s", style="dim")
        if diverged_at == (view.agent, view.number, n.folder):
            timeline.append(" (replay diverged here)", style="bold magenta")
        timeline.append("  ")
    return timeline


def _call_parts(call: CallView, limit: int | None) -> list[Any]:
    """One tool call: its name, how its arguments were repaired, the arguments and the result."""
    line = Text("call ", style="bold")
    line.append(call.label, style="cyan")
    if call.repair_error:
        line.append(f"  arguments NOT repaired: {call.repair_error}", style="red")
    else:
        quiet = call.repair_stage == "strict"  # clean JSON: nothing to look at
        line.append(f"  repair: {call.repair_stage}", style="dim" if quiet else "yellow")
    parts: list[Any] = [line]
    if call.arguments is not None:
        parts.append(Syntax(clip(to_yaml(call.arguments), limit).rstrip(), "yaml", word_wrap=True))
    else:
        parts.append(Text(clip(call.arguments_text, limit), style="dim"))
    if call.result is not None:
        parts.append(
            Text("result: ", style="bold").append(clip(call.result, limit), style="red" if call.result_error else "")
        )
    return parts


def _turn_panel(view: TurnView, diverged_at: DivergedAt | None, limit: int | None) -> Panel:
    who = f"turn {view.number}" + (f" (agent {view.agent})" if view.agent != MAIN_AGENT else "")
    parts: list[Any] = [_timeline(view, diverged_at)]
    if view.text is not None:
        parts.append(Text("model: ", style="bold").append(clip(view.text, limit), style=""))
    for call in view.calls:
        parts.extend(_call_parts(call, limit))
    for bad in view.bad_calls:
        parts.append(Text(f"bad tool call: {bad.reason}", style="bold red"))
        parts.append(Text(clip(bad.raw, limit), style="dim"))
    for node in view.errors:
        parts.append(Text(f"{node.folder} failed: {node.error}", style="bold red"))
    for problem in view.problems:
        parts.append(Text(f"! {problem}", style="yellow"))
    return Panel(
        Group(*parts),
        title=f"{who}  {view.duration_s:.3f}s",
        title_align="left",
        border_style="red" if view.errors or view.bad_calls else "blue",
    )


def cmd_task(run: RunRecord, console: Console, as_json: bool, task_id: str, full: bool) -> int:
    task = find_task(run, task_id)
    views = task_turn_views(task)
    failures = task_failures(task, views)
    row = result_row(task)
    replay = replay_detail(run, task)
    if as_json:
        data: dict[str, Any] = {"result": row.to_dict()}
        if replay is not None:
            data["replay"] = replay.to_dict()
        emit_json({**data, "turns": [v.to_dict() for v in views], "failures": [asdict(f) for f in failures]})
        return 0
    limit = None if full else 600
    # The node where the replay parted from the saved run, marked in its turn's timeline.
    diverged_at = (replay.agent, replay.turn, replay.folder) if replay is not None and replay.folder else None
    console.print(_task_panel(task, row, replay))
    for problem in task.problems:
        console.print(f"[yellow]! {esc(problem)}[/yellow]")
    if replay is not None and replay.status != "exact":
        console.print(_replay_panel(run, task.task_id, replay, limit))
    for view in views:
        console.print(_turn_panel(view, diverged_at, limit))
    if failures:
        console.print(failure_table(failures, title="what went wrong"))
    epoch = " --agent epochs/<n>" if task.epochs and not task.turns else ""
    console.print(
        f"[dim]a node's input and output: {PROG} {esc(run.path)} node {esc(task.task_id)} <turn> <node>{epoch}[/dim]"
    )
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id")
    parser.add_argument("--full", action="store_true", help="do not shorten long texts")


def _run(run: RunRecord, console: Console, as_json: bool, ns: argparse.Namespace) -> int:
    return cmd_task(run, console, as_json, ns.task_id, ns.full)


COMMAND = RunCommand("task", "one task: turns, tool calls, repairs, errors, the answer", _arguments, _run)
