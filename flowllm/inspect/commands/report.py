"""``python -m flowllm.inspect report RUN_DIR|MULTIRUN_DIR [-o report.html]``: a self-contained HTML report."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from flowllm.inspect.artifacts import NotARunError
from flowllm.inspect.commands.common import PROG, UsageError
from flowllm.inspect.commands.render import emit_json, esc
from flowllm.inspect.report import write_report
from flowllm.rundir.store import local_run


def cmd_report(path: str, output: str | None, max_chars: int, console: Console, as_json: bool) -> int:
    target = local_run(path)  # a store's URL (experiment.store): its local copy
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


def main(argv: Sequence[str], console: Console) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} report", description="Write a self-contained HTML report.")
    parser.add_argument("path", help="a run directory or a multirun directory")
    parser.add_argument("-o", "--output", help="the HTML file (default: <dir>/report.html)")
    parser.add_argument(
        "--max-chars", type=int, default=20000, help="longest text kept per value in the report (default 20000)"
    )
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(list(argv))
    return cmd_report(ns.path, ns.output, ns.max_chars, console, ns.json)
