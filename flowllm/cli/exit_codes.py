"""What ``python -m flowllm`` (and ``flowllm run``) exits with, so scripts and CI can tell runs apart.

A wrong answer is not a failure: a task that completed with a wrong answer counts as completed. A task failed
when it could not finish (a provider error, a timeout, a missing attachment).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    OK = 0  # every task completed (right or wrong)
    BUG = 1  # an unexpected exception: a traceback was printed (Python's own code)
    CONFIG = 2  # a setting, the dataset, a key or a server was wrong: nothing ran (one line on stderr)
    SOME_FAILED = 3  # some tasks failed, others completed
    BUDGET = 3  # the run's budget (experiment.budget) ended it with tasks left: rerun with a higher one to resume
    ALL_FAILED = 4  # every task that ran failed
    SWEEP_JOB_ERROR = 5  # a multirun job could not run or crashed (the others' results are saved)
    INTERRUPTED = 130  # Ctrl-C: what finished is saved, a rerun into the same folder resumes


def run_exit_code(summary: Mapping[str, Any]) -> ExitCode:
    """The code of one finished (or interrupted) run, from its ``summary.json``."""
    if summary.get("interrupted"):
        return ExitCode.INTERRUPTED
    if (summary.get("budget") or {}).get("ended_run"):
        return ExitCode.BUDGET
    failed = int(summary.get("failed") or 0)
    # A task ended by a per-task limit finished (it is scored on its answer): it is not a failure.
    completed = int(summary.get("completed") or 0) + int(summary.get("limited") or 0)
    if failed == 0:
        return ExitCode.OK
    return ExitCode.ALL_FAILED if completed == 0 else ExitCode.SOME_FAILED


def sweep_exit_code(jobs: Iterable[Mapping[str, Any]]) -> ExitCode:
    """The code of a multirun from its jobs' rows (status, completed, failed): the worst job decides.

    An interrupted job wins, then a job that errored (or never wrote a summary), then task failures: all failed
    only when every task of every job failed.
    """
    rows = list(jobs)
    statuses = {str(row.get("status")) for row in rows}
    if "interrupted" in statuses:
        return ExitCode.INTERRUPTED
    if statuses & {"error", "unfinished"}:
        return ExitCode.SWEEP_JOB_ERROR
    codes = [run_exit_code(row) for row in rows]
    if codes and all(code is ExitCode.ALL_FAILED for code in codes):
        return ExitCode.ALL_FAILED
    if any(code is not ExitCode.OK for code in codes):
        return ExitCode.SOME_FAILED
    return ExitCode.OK
