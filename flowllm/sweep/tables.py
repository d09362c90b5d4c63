"""The end-of-run tables on stdout, and on stderr when stdout is gone.

``python -m flowllm ... | tee out`` under Ctrl-C: the terminal's SIGINT reaches ``tee`` too, so by the time the
run has saved what finished and prints its table, nobody reads stdout. A closed stdout is not a failure of the
run: the table goes to stderr instead (a redirect to a file there keeps it), stdout is pointed at the null device
so the interpreter's last flush cannot fail either, and the run exits with the code its summary decides.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from flowllm.run.report import print_summary
from flowllm.rundir.results import RunSummary
from flowllm.spend.task_usage import read_bills

# Wide enough that a table written to a file or a log does not wrap every cell (as report.make_console).
FILE_WIDTH = 160


def _silence_stdout() -> None:
    """Point file descriptor 1 at the null device: nothing written later (a buffered flush at exit) can fail."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


class _ReaderGone(Console):
    """A console that lets a closed pipe be seen: rich's own default ends the process with ``SystemExit(1)``,
    the code of a bug."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def _console(stderr: bool) -> Console:
    console = _ReaderGone(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = _ReaderGone(stderr=stderr, width=FILE_WIDTH)
    return console


def print_tables(draw: Callable[[Console], None]) -> bool:
    """``draw`` the tables on stdout; when stdout's reader has gone, again on stderr. True when stdout took them."""
    try:
        draw(_console(stderr=False))
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        _silence_stdout()
    with contextlib.suppress(OSError):  # stderr gone too: the summary files hold everything
        draw(_console(stderr=True))
    return False


def print_run_tables(summary: RunSummary | Mapping[str, Any], outcomes: Sequence[Any], run_dir: Path) -> bool:
    """A run's task table and summary as ``print_tables`` prints them, each task's tokens and cost as its ledger
    billed them: the one table of a run, whether one process or its workers' parent ran it."""
    bills = read_bills(run_dir)
    return print_tables(lambda console: print_summary(summary, outcomes, run_dir, console=console, bills=bills))
