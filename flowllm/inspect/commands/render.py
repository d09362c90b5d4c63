"""How ``flowllm inspect`` draws in the terminal: the console, values as text, key-value tables, JSON out."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flowllm.inspect.replay import replay_label
from flowllm.inspect.views import Failure

STATUS_STYLES = {"correct": "green", "wrong": "yellow", "unscored": "magenta"}
REPLAY_STYLES = {"exact": "green", "diverged": "magenta", "missing": "red", "unverified": "yellow", "forked": "cyan"}


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


def fmt(value: Any) -> str:
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


def status_style(status: str, correct: bool | None = None) -> str:
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


def kv_table(rows: Sequence[tuple[str, Any]], title: str | None = None) -> Table:
    table = Table(box=box.SIMPLE, show_header=False, title=title, title_justify="left", pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        # Text, never a markup string: values are data and may contain [brackets].
        table.add_row(key, value if isinstance(value, Text) else Text(fmt(value)))
    return table


def pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def seconds(value: Any) -> str:
    return f"{value:,.1f}s" if isinstance(value, (int, float)) else "-"


def clip(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters; --full shows all]"


def replay_text(verdict: dict[str, Any] | None, cell: bool = False) -> Text:
    """A replay verdict, coloured; in a table cell, where it diverged goes on a second line."""
    label = replay_label(verdict)
    if cell:
        label = label.replace(" at ", " at\n", 1)
    return Text(label, style=REPLAY_STYLES.get((verdict or {}).get("status", ""), "dim"))


def failure_table(failures: list[Failure], title: str) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("kind", no_wrap=True)
    table.add_column("where", overflow="fold")
    table.add_column("reason", overflow="fold")
    for f in failures:
        style = "yellow" if f.kind in ("wrong_answer", "unreadable") else "red"
        table.add_row(Text(f.kind, style=style), f.where, f.reason)
    return table
