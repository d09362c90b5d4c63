"""``python -m flowllm.inspect RUN_DIR failures [--kind bad_tool_call]``: everything that went wrong in the run."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from rich.console import Console

from flowllm.inspect.artifacts import RunRecord
from flowllm.inspect.commands.common import RunCommand
from flowllm.inspect.commands.render import emit_json, failure_table
from flowllm.inspect.views import run_failures

FAILURE_KINDS = (
    "task_failed",
    "wrong_answer",
    "bad_tool_call",
    "repair_failed",
    "tool_error",
    "node_error",
    "unreadable",
)


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
    console.print(failure_table(failures, title=f"failures in {run.path} ({len(failures)})"))
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=FAILURE_KINDS)


def _run(run: RunRecord, console: Console, as_json: bool, ns: argparse.Namespace) -> int:
    return cmd_failures(run, console, as_json, ns.kind)


COMMAND = RunCommand("failures", "every failed task, bad tool call, failed repair and tool error", _arguments, _run)
