"""``python -m flowllm.inspect RUN_DIR grep TEXT [--regex]``: find text in every artifact of the run."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from rich import box
from rich.console import Console
from rich.table import Table

from flowllm.inspect.artifacts import MAIN_AGENT, RunRecord
from flowllm.inspect.commands.common import RunCommand
from flowllm.inspect.commands.render import emit_json
from flowllm.inspect.views import grep_run
from flowllm.run.report import plural


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


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern")
    parser.add_argument("--regex", action="store_true")
    parser.add_argument("--limit", type=int, default=200)


def _run(run: RunRecord, console: Console, as_json: bool, ns: argparse.Namespace) -> int:
    return cmd_grep(run, console, as_json, ns.pattern, ns.regex, ns.limit)


COMMAND = RunCommand("grep", "find text in every artifact of the run (case-insensitive)", _arguments, _run)
