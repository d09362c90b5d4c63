"""``python -m flowllm.inspect audit RUN [--pattern REGEX]``: the contamination audit of a saved run.

Every task whose ground truth (or an answer pattern) came back in a tool result from outside its own files, with
the conversation, turn, tool, URL and the text around it; the guard's blocks; the accuracy over all scored tasks
and over those not flagged (flowllm/export/contamination.py). Works on runs of any flowllm version: the audit
reads the saved turns, not ``summary.json``. The patterns are the run's ``tools.web.answer_patterns`` and those
given here.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from flowllm.export.contamination import Audit, audit_run, headline
from flowllm.inspect.commands.common import PROG, UsageError, open_run_dir
from flowllm.inspect.commands.render import emit_json
from flowllm.scoring.stats import format_estimate


def _run_patterns(config: dict[str, Any] | None) -> list[str]:
    tools = (config or {}).get("tools")
    web = tools.get("web") if isinstance(tools, dict) else None
    patterns = web.get("answer_patterns") if isinstance(web, dict) else None
    return [str(p) for p in patterns] if isinstance(patterns, list) else []


def _table(audit: Audit) -> Table:
    table = Table(title=f"flagged ({len(audit.flags)})", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("task", "agent", "turn", "tool", "url", "matched", "excerpt"):
        table.add_column(column, overflow="fold")
    for f in audit.flags:
        agent = f.agent if f.epoch == 1 else f"{f.agent} (epoch {f.epoch})"
        table.add_row(f.task_id, agent, str(f.turn), f.tool, f.url or "-", f.matched, f.excerpt)
    return table


def cmd_audit(path: str, patterns: Sequence[str], console: Console, as_json: bool) -> int:
    run = open_run_dir(path)
    listed = list(dict.fromkeys([*_run_patterns(run.config), *patterns]))
    for pattern in listed:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"--pattern {pattern!r} is not a regular expression: {exc}") from None
    audit = audit_run(run.path, listed)
    block = audit.block()
    if as_json:
        emit_json({**block.to_dict(), "flags": [f.to_dict() for f in audit.flags]})
        return 0
    console.print(headline(block))
    console.print(f"  all: {format_estimate(block.accuracy)}")
    console.print(f"  not flagged: {format_estimate(block.accuracy_excluding_flagged)}")
    blocked = ", ".join(f"{tool} {n}" for tool, n in block.blocked_by_tool.items())
    console.print(f"answer sources blocked: {block.blocked}" + (f" ({blocked})" if blocked else ""))
    if audit.flags:
        console.print(_table(audit))
    else:
        console.print("[green]no task's answer came back from outside its own files[/green]")
    return 0


def main(argv: Sequence[str], console: Console) -> int:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} audit", description="Tasks whose answer came back from outside their own files."
    )
    parser.add_argument("path", help="a run directory")
    parser.add_argument(
        "--pattern", action="append", default=[], help="a regular expression to look for too (repeatable)"
    )
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(list(argv))
    return cmd_audit(ns.path, ns.pattern, console, ns.json)
