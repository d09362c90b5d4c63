"""``python -m flowllm.inspect``: a saved run in the terminal.

    python -m flowllm.inspect RUN_DIR                     summary: settings, figures, what went wrong
    python -m flowllm.inspect RUN_DIR tasks [--status failed] [--level 2] [--replay diverged]
    python -m flowllm.inspect RUN_DIR task TASK_ID        turns, tool calls, repairs, errors, the answer
    python -m flowllm.inspect RUN_DIR node TASK TURN NODE [--only input|output|meta] [--raw]
    python -m flowllm.inspect RUN_DIR grep TEXT [--regex]
    python -m flowllm.inspect RUN_DIR failures [--kind bad_tool_call]
    python -m flowllm.inspect diff RUN_A RUN_B [--all]
    python -m flowllm.inspect report RUN_DIR|MULTIRUN_DIR [-o report.html]
    python -m flowllm.inspect audit RUN [--pattern REGEX]   answers that came from outside a task's own files
    python -m flowllm.inspect usage RUN [RUN...] [--by user,model]   usage ledgers summed across runs
    python -m flowllm.inspect scale RUN [RUN...] [--k K] [--agreement A] [--plot FILE]   scaling from saved epochs
    python -m flowllm.inspect bisect RUN_A RUN_B [--max-cost USD] [--sample N]   a difference, setting by setting
    python -m flowllm.inspect power --baseline 0.6 --delta 0.05 [--epochs 3] [--within-var V] [--run RUN]
    python -m flowllm.inspect export RUN --format inspect|otlp|gaia-submission [-o FILE] [--endpoint URL]  (no --json)

Every command takes ``--json`` (machine-readable output on stdout). Exit status: 0 done, 2 bad input (bad usage,
a folder that is not a run, a task, turn or node the run does not have: flowllm.errors.CliError), 1 a bug.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from flowllm.core.registry import Registry
from flowllm.errors import CliError
from flowllm.inspect import export_command, power, usage
from flowllm.inspect.commands import audit, bisect, diff, failures, grep, node, report, scale, summary, task, tasks
from flowllm.inspect.commands.common import PROG, NotFound, RunCommand, ToolCommand, UsageError, open_run_dir
from flowllm.inspect.commands.render import make_console

__all__ = ["RUN_COMMANDS", "TOOL_COMMANDS", "NotFound", "UsageError", "main"]

# ``python -m flowllm.inspect <name> ...``: commands that take their own arguments (one module each).
TOOL_COMMANDS: Registry[ToolCommand] = Registry(
    "command",
    {
        "diff": diff.main,
        "report": report.main,
        "usage": usage.main,
        "power": power.main,
        "export": export_command.run_export,  # Inspect AI logs, OpenTelemetry spans, GAIA submissions
        "audit": audit.main,  # tasks whose answer came back from outside their own files
        "scale": scale.main,  # test-time scaling curves from saved epochs
        "bisect": bisect.main,  # a difference between two runs attributed to each changed setting, by forks
    },
)
# ``python -m flowllm.inspect RUN_DIR [name] ...``: commands on one saved run (one module each; summary first).
RUN_COMMANDS: Registry[RunCommand] = Registry(
    "command",
    {
        command.name: command
        for command in (
            summary.COMMAND,
            tasks.COMMAND,
            task.COMMAND,
            node.COMMAND,
            grep.COMMAND,
            failures.COMMAND,
        )
    },
)


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{PROG} RUN_DIR", description="Look at a saved flowllm run.")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command")
    for name in RUN_COMMANDS:
        command = RUN_COMMANDS.require(name, UsageError)
        p = sub.add_parser(name, help=command.help)
        command.add_arguments(p)
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    return parser


def _on_run(run_path: str, rest: Sequence[str], console: Console) -> int:
    """A command on one run: its arguments parsed, the run opened, the command looked up and run."""
    ns = _run_parser().parse_args(list(rest))
    run = open_run_dir(run_path)
    command = RUN_COMMANDS.require(ns.command or "summary", UsageError)
    return command.run(run, console, bool(ns.json), ns)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    console = make_console()
    try:
        if not args or args[0] in ("-h", "--help"):
            sys.stdout.write((__doc__ or "").split("\n\n", 1)[1])
            return 0 if args else 2
        tool = TOOL_COMMANDS.get(args[0])
        if tool is not None:
            return tool(args[1:], console)
        return _on_run(args[0], args[1:], console)
    except CliError as exc:  # bad input (a missing run, task or turn...): one line, the code the error carries
        print(f"flowllm.inspect: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `... | head` closed the pipe: not an error worth a traceback
        return 0
