"""``python -m flowllm.inspect diff RUN_A RUN_B [--all]``: two runs compared task by task."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from flowllm.inspect.commands.common import PROG, UsageError, open_run_dir
from flowllm.inspect.commands.render import emit_json, esc, fmt, kv_table, pct, replay_text
from flowllm.inspect.diff import RunDiff, TaskDiff, diff_runs
from flowllm.inspect.paired import NoCommonTasks, paired_block, render_paired
from flowllm.inspect.provenance import provenance_changes
from flowllm.inspect.replay import REPLAY_STATUSES
from flowllm.inspect.views import SPEND_SOURCES, run_spend
from flowllm.run.report import format_tokens, format_usd, plural
from flowllm.rundir.layout import LEDGER_FILE


def _change(a: float | None, b: float | None, money: bool = False) -> str:
    if a is None or b is None:
        return "-"
    delta = b - a
    shown = format_usd(abs(delta)) if money else f"{abs(delta):,.0f}"
    # The sign of what is shown: costs summed from rounded per-call figures differ in the sixth decimal.
    same = shown == (format_usd(0.0) if money else "0")
    sign = "±" if same else "+" if delta > 0 else "-"
    pct_change = f" ({delta / a:+.1%})" if a else ""
    return f"{sign}{shown}{pct_change}"


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


def _changes_table(changes: dict[str, tuple[Any, Any]], title: str) -> Table:
    return kv_table([(k, f"{fmt(x)} -> {fmt(y)}") for k, (x, y) in changes.items()], title=title)


def _task_panel(t: TaskDiff) -> Panel:
    """One task that differs: its changed fields and calls, replay verdicts and first divergence."""
    rows: list[tuple[str, Any]] = [(k, f"{fmt(x)} -> {fmt(y)}") for k, (x, y) in t.changes.items()]
    rows += [("tool calls", c) for c in t.call_changes]
    if t.replay is not None:
        rows.append(("replay", replay_pair(*t.replay, differs=t.replay_differs)))
    if t.divergence:
        rows.append(("first divergence", Text(t.divergence.describe(), style="magenta")))
    title = Text(t.task_id)
    if t.replay_differs:
        title.append("  replay verdict differs", style="bold magenta")
    border = "magenta" if t.replay_differs else "yellow"
    return Panel(kv_table(rows), title=title, title_align="left", border_style=border)


def _print_tasks(console: Console, result: RunDiff, show_all: bool) -> None:
    if not result.tasks:
        console.print(f"[green]no task differs ({len(result.unchanged)} compared)[/green]")
        if result.replay is not None:
            console.print(replay_line(result))
        return
    for t in result.tasks:
        if t.only_in:
            console.print(f"[yellow]{esc(t.task_id)}[/yellow]: only in {t.only_in}")
            continue
        console.print(_task_panel(t))
    console.print(
        f"{len(result.tasks)} task(s) differ, {len(result.unchanged)} unchanged"
        + (f": {', '.join(result.unchanged)}" if show_all and result.unchanged else "")
    )
    if result.replay is not None:
        console.print(replay_line(result))


def cmd_diff(a_path: str, b_path: str, console: Console, as_json: bool, show_all: bool) -> int:
    a, b = open_run_dir(a_path), open_run_dir(b_path)
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
        console.print(_changes_table(origin, "provenance and settings that differ"))
    console.print(spend_table(spend_a, spend_b))
    if result.settings_changes:
        console.print(_changes_table(result.settings_changes, "settings that differ"))
    if result.summary_changes:
        console.print(_changes_table(result.summary_changes, "figures that differ"))
    if result.replay is not None:
        console.print(replay_table(*result.replay))
    render_paired(console, paired, paired_json)
    _print_tasks(console, result, show_all)
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


def _replay_cell(counts: dict[str, Any] | None, key: str) -> str:
    if counts is None:
        return "not a replay" if key == "exact" else "-"
    if key == "accuracy_exact":
        return f"{pct(counts[key])} ({counts['exact_correct']}/{counts['exact_judged']})"
    if key == "accuracy_scored":
        return f"{pct(counts[key])} ({counts['scored_correct']}/{counts['scored_judged']})"
    if key.startswith("fork."):
        fork = counts.get("fork")
        if fork is None:
            return "-"
        value = fork.get(key.removeprefix("fork."))
        return "not known" if value is None else f"${float(value):.4f}"
    return str(counts[key])


def replay_table(a: dict[str, Any] | None, b: dict[str, Any] | None) -> Table:
    """Each side's replay counts and its accuracy on exact replays and on all tasks."""
    table = Table(title="replay", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("", "A", "B"):
        table.add_column(name, justify="right" if name else "left")
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
        table.add_row(label, _replay_cell(a, key), _replay_cell(b, key))
    return table


def main(argv: Sequence[str], console: Console) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} diff", description="Compare two runs task by task.")
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("--all", action="store_true", help="also name the unchanged tasks")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(list(argv))
    return cmd_diff(ns.run_a, ns.run_b, console, ns.json, ns.all)
