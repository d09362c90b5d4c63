"""The command-line reference, read from the commands themselves.

Each command is reached through the ``flowllm`` console script's own dispatch (``flowllm.cli.command.main``) with
the arguments a user would type; the argument parser it builds is caught when it starts parsing, before anything
runs, and rendered: usage, description, every argument with its help, choices and default, and its subcommands.
The run command's overrides are Hydra's, not argparse's: its page is the ``flowllm --help`` text and the config
groups' choices, as ``flowllm list`` prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from unittest import mock

WIDTH = 100  # the usage lines' width, whatever the terminal building the site


@dataclass(frozen=True)
class Command:
    title: str  # as a user types it
    argv: tuple[str, ...]  # what flowllm.cli.command.main is given (RUN: any folder name; nothing is opened)
    also: str = ""  # the same command under another name


COMMANDS = (
    Command("flowllm verify", ("verify", "RUN"), "python -m flowllm verify"),
    Command("flowllm inspect RUN", ("inspect", "RUN"), "python -m flowllm.inspect RUN"),
    Command("flowllm inspect diff", ("inspect", "diff"), "python -m flowllm.inspect diff"),
    Command("flowllm inspect report", ("inspect", "report"), "python -m flowllm.inspect report"),
    Command("flowllm inspect usage", ("inspect", "usage"), "python -m flowllm.inspect usage"),
    Command("flowllm inspect power", ("inspect", "power"), "python -m flowllm.inspect power"),
    Command("flowllm inspect export", ("inspect", "export"), "python -m flowllm.inspect export"),
    Command("flowllm sweep-summary", ("sweep-summary",), "python -m flowllm.sweep.summary"),
)


class ParserFound(Exception):
    """Raised from inside a command at its first parse, carrying the parser it built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _capture(parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
    raise ParserFound(parser)


def parser_of(main: Callable[[Sequence[str]], int], argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser ``main(argv)`` builds, caught before it parses (so before the command does anything)."""
    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", _capture):
        try:
            main(list(argv))
        except ParserFound as found:
            return found.parser
    raise RuntimeError(f"flowllm {' '.join(argv)} parsed no arguments: update docs/hooks/cli_reference.py COMMANDS")


def printed(main: Callable[[Sequence[str]], int], argv: Sequence[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(list(argv))
    return out.getvalue()


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _escape(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")


def _argument(action: argparse.Action) -> str | None:
    if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
        return None
    if action.option_strings:
        metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        name = ", ".join(f"{option}{metavar}" for option in action.option_strings)
    else:
        name = action.metavar or action.dest
    facts = []
    if action.required and action.option_strings:
        facts.append("required")
    if action.choices:
        facts.append("one of " + ", ".join(f"`{choice}`" for choice in action.choices))
    if isinstance(action, argparse._AppendAction):
        facts.append("may be given several times")
    if action.nargs in ("+", "*"):
        facts.append("one or more" if action.nargs == "+" else "any number")
    shown = action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in (action.help or "")
    if shown:
        facts.append(f"default `{action.default}`")
    about = _escape(action.help or "") if action.help != argparse.SUPPRESS else ""
    detail = "; ".join(part for part in (about, *facts) if part)
    return f"- `{name}`" + (f": {detail}" if detail else "")


def render_parser(
    parser: argparse.ArgumentParser, title: str, level: int = 2, also: str = "", summary: str = ""
) -> list[str]:
    lines = [f"{'#' * level} `{title}`", ""]
    if summary:
        lines += [_escape(summary[0].upper() + summary[1:]) + ".", ""]
    if also:
        lines += [f"Also: `{also}`.", ""]
    lines += ["```text", _usage(parser), "```", ""]
    if parser.description:
        lines += [_escape(parser.description), ""]
    arguments = [line for line in map(_argument, parser._actions) if line]
    lines += [*arguments, ""] if arguments else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                lines += render_parser(sub, f"{title} {name}", level + 1, summary=helps.get(name) or "")
    return lines


def _lists() -> Iterator[str]:
    from flowllm.cli.command import main
    from flowllm.cli.listing import LISTS

    for what, group in LISTS.items():
        yield f"### `flowllm list {what}`"
        yield ""
        yield f"The choices of the config group `{group}` (the first comment of each file):"
        yield ""
        yield "```text"
        yield printed(main, ["list", what]).rstrip()
        yield "```"
        yield ""


def reference_page() -> str:
    from flowllm.cli.command import main

    lines = [
        "# Command-line reference",
        "",
        "Generated from the commands when the site is built: each parser below is the one the command builds, "
        "reached through the `flowllm` console script's own dispatch.",
        "",
        "## `flowllm run`",
        "",
        "Also: `flowllm OVERRIDES...` and `python -m flowllm OVERRIDES...`. The arguments are Hydra overrides "
        "(see the [configuration reference](configuration.md)); `flowllm --help` prints:",
        "",
        "```text",
        printed(main, ["--help"]).rstrip(),
        "```",
        "",
        "## `flowllm list`",
        "",
        *_lists(),
    ]
    for command in COMMANDS:
        lines += render_parser(parser_of(main, command.argv), command.title, also=command.also)
    return "\n".join(lines) + "\n"
