"""What ``python -m flowllm`` (and ``flowllm run``) exits with, so scripts and CI can tell runs apart.

A wrong answer is not a failure: a task that completed with a wrong answer counts as completed. A task failed
when it could not finish (a provider error, a timeout, a missing attachment).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import IntEnum
from typing import Any

from flowllm.errors import BuildError, RunStopped
from flowllm.rundir.results import RunSummary


class ExitCode(IntEnum):
    """The code and what it means. A budget stop exits 3 as a run with failed tasks does (both: rerun into the same
    folder to finish), but is its own member, so what a run or a sweep says about its end names the budget. As
    ints the two are equal: tell members apart with ``is``."""

    meaning: str

    def __new__(cls, code: int, meaning: str) -> ExitCode:
        member = int.__new__(cls, code)
        member._value_ = (code, meaning)  # type: ignore[assignment]  # (code, meaning): BUDGET is no alias of 3
        member.meaning = meaning
        return member

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {int(self)}>"

    OK = 0, "every task completed (right, wrong or unscored)"
    BUG = 1, "a bug in flowllm (a traceback was printed)"
    CONFIG = 2, "nothing ran: a setting, the dataset, a key or a server is wrong"  # a BuildError (one line)
    SOME_FAILED = 3, "some tasks failed"  # (or were left unfinished by a run error), others completed
    BUDGET = 3, "the budget ended the run"  # experiment.budget ended it with tasks left: a higher one resumes
    ALL_FAILED = 4, "every task failed"  # or a run error stopped the run before any task completed
    SWEEP_JOB_ERROR = 5, "a sweep job errored"  # a multirun job could not run or crashed (the others are saved)
    UNVERIFIED = 6, "a number of the run disagrees with its evidence"  # flowllm verify found a disagreement
    INTERRUPTED = 130, "interrupted"  # Ctrl-C: what finished is saved, a rerun into the same folder resumes


def run_exit_code(summary: RunSummary | Mapping[str, Any]) -> ExitCode:
    """The code of one finished (or interrupted) run, from its ``summary.json``.

    A run that stopped on a run error (``status: failed``, e.g. a worker process died) counts the tasks it left
    unfinished as failed: 3 when some completed, 4 when none did. A Ctrl-C is 130 whatever finished."""
    summary = RunSummary.coerce(summary)
    if summary.status != "failed" and summary.interrupted:
        return ExitCode.INTERRUPTED
    if summary.budget_ended_run:
        return ExitCode.BUDGET
    failed = int(summary.failed or 0)
    if summary.status == "failed":
        failed += int(summary.unfinished or 0) or 1
    # A task ended by a per-task limit finished (it is scored on its answer): it is not a failure.
    completed = int(summary.completed or 0) + int(summary.limited or 0)
    if failed == 0:
        return ExitCode.OK
    return ExitCode.ALL_FAILED if completed == 0 else ExitCode.SOME_FAILED


def sweep_exit_code(jobs: Iterable[Mapping[str, Any]]) -> ExitCode:
    """The code of a multirun from its jobs' rows (status, completed, failed, budget): the worst job decides.

    An interrupted job wins, then a job that errored, stopped on a run error (``failed``) or never wrote a
    summary, then task failures (all failed only when every task of every job failed), then a job its budget
    ended (3, said as the budget).
    """
    rows = list(jobs)
    statuses = {str(row.get("status")) for row in rows}
    if "interrupted" in statuses:
        return ExitCode.INTERRUPTED
    if statuses & {"error", "unfinished", "failed"}:
        return ExitCode.SWEEP_JOB_ERROR
    codes = [run_exit_code(row) for row in rows]
    if codes and all(code is ExitCode.ALL_FAILED for code in codes):
        return ExitCode.ALL_FAILED
    if any(code is ExitCode.SOME_FAILED or code is ExitCode.ALL_FAILED for code in codes):
        return ExitCode.SOME_FAILED
    return ExitCode.BUDGET if any(code is ExitCode.BUDGET for code in codes) else ExitCode.OK


def error_exit_code(exc: BaseException) -> ExitCode:
    """The code of a flowllm error that reached the app, by its class: a build error is 2 (nothing ran); a run
    error that stopped the run after tasks ran follows the tasks of the summary it wrote (3 or 4)."""
    if isinstance(exc, BuildError):
        return ExitCode.CONFIG
    if isinstance(exc, RunStopped) and exc.summary is not None:
        return run_exit_code(exc.summary)
    return ExitCode.ALL_FAILED
