"""What every ``flowllm inspect`` command shares: its errors, how it opens a run and a task, and what it takes.

A command on one run (``summary``, ``tasks``, ``task``, ``node``, ``grep``, ``failures``) is a ``RunCommand``:
its arguments, added to the run's parser, and a function of the opened run. A command of its own (``diff``,
``report``, ``usage``, ``power``, ``export``) parses its own arguments: a ``ToolCommand``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from flowllm.errors import CliError
from flowllm.inspect.artifacts import NotARunError, RunRecord, open_run

PROG = "python -m flowllm.inspect"


class UsageError(CliError):
    """Bad arguments, or a folder that is not a run: exit status 2."""


class NotFound(CliError):
    """A task, turn or node that the run does not have: exit status 2 (bad input)."""


@dataclass(frozen=True)
class RunCommand:
    """A command on one saved run: ``python -m flowllm.inspect RUN_DIR <name> ...``."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[RunRecord, Console, bool, argparse.Namespace], int]


ToolCommand = Callable[[Sequence[str], Console], int]
"""A command with its own arguments: ``python -m flowllm.inspect <name> ...``; returns the exit status."""


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """A run command that takes nothing but ``--json``."""


def open_run_dir(path: str) -> RunRecord:
    try:
        return open_run(path)
    except NotARunError as exc:
        raise UsageError(str(exc)) from None


def find_task(run: RunRecord, task_id: str) -> Any:
    try:
        return run.task(task_id)
    except KeyError as exc:
        raise NotFound(exc.args[0]) from None
