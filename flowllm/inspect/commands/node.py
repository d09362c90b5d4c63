"""``python -m flowllm.inspect RUN_DIR node TASK TURN NODE [--only input|output|meta] [--raw]``: one node's files."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from flowllm.inspect.artifacts import MAIN_AGENT, Artifact, RunRecord
from flowllm.inspect.commands.common import NotFound, RunCommand, UsageError, find_task
from flowllm.inspect.commands.render import emit_json, esc, to_yaml
from flowllm.inspect.views import readable_media


def _body(name: str, artifact: Artifact, raw: bool) -> Any:
    """One artifact as shown: readable YAML (a traceback apart, in red), or the JSON as saved with --raw."""
    value = artifact.value
    if name == "meta" and isinstance(value, dict) and value.get("traceback") and not raw:
        value = {k: v for k, v in value.items() if k != "traceback"}
        return Group(
            Syntax(to_yaml(value).rstrip(), "yaml", word_wrap=True),
            Text(str(artifact.value["traceback"]).rstrip(), style="red"),
        )
    if raw:
        return Syntax(json.dumps(value, indent=2, ensure_ascii=False), "json", word_wrap=True)
    # images and other media as one line each (blobs/ holds the bytes; --raw shows the record as saved)
    return Syntax(to_yaml(readable_media(value)).rstrip(), "yaml", word_wrap=True)


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
    task = find_task(run, task_id)
    number_text = turn.removeprefix("turn_").lstrip("0") or "0"
    if not number_text.isdigit():
        raise UsageError(f"turn must be a number (1, 2...) or turn_NNN, not '{turn}'")
    try:
        record = task.turn(int(number_text), agent)
    except KeyError as exc:
        raise NotFound(exc.args[0]) from None
    if record is None:
        known = ", ".join(str(t.number) for t in task.turns_of(agent)) or "none"
        epochs = task.epochs if agent == MAIN_AGENT and not task.turns else []  # a task run over epochs
        hint = f"; it ran {len(epochs)} epochs: name one with --agent {epochs[0]} (to {epochs[-1]})" if epochs else ""
        raise NotFound(f"task '{task.task_id}' has no turn {number_text} (turns: {known}){hint}")
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
            f"[bold]{esc(task.task_id)}[/bold]{'' if agent == MAIN_AGENT else ' / ' + esc(agent)} / "
            f"turn {record.number} / "
            f"[bold]{esc(node.folder)}[/bold]\n"
            f"[dim]{esc(node.path)}[/dim]",
            border_style="cyan",
        )
    )
    for name, artifact in parts.items():
        if not artifact.ok:
            console.print(Panel(Text(artifact.error or "unreadable", style="yellow"), title=name, title_align="left"))
            continue
        console.print(Panel(_body(name, artifact, raw), title=name, title_align="left"))
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id")
    parser.add_argument("turn")
    parser.add_argument("node", help="call_model, 03 or 03_call_model")
    parser.add_argument(
        "--agent", default=MAIN_AGENT, help="a sub-agent's path, or an epoch's (epochs/2) (default: the main agent)"
    )
    parser.add_argument("--only", choices=("input", "output", "meta"))
    parser.add_argument(
        "--raw", action="store_true", help="JSON as saved instead of the readable form (media as one line each)"
    )


def _run(run: RunRecord, console: Console, as_json: bool, ns: argparse.Namespace) -> int:
    return cmd_node(run, console, as_json, ns.task_id, ns.turn, ns.node, ns.agent, ns.only, ns.raw)


COMMAND = RunCommand("node", "one node's input, output and meta", _arguments, _run)
