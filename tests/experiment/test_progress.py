"""The progress bar's columns, rendered with rich into a string: tasks running, accuracy, tokens and cost read
from a real usage ledger file while it is appended to (before any task ends), failed tasks and the ETA.

The bar is built with auto_refresh off and drawn on demand, so nothing here depends on timing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from flowllm.core.types import Usage
from flowllm.providers.ledger import LedgerTail, UsageLedger
from flowllm.run.outcome import BUDGET, COMPLETED, FAILED, LIMIT, TaskOutcome
from flowllm.run.progress import ProgressReporter
from flowllm.spend.pricing import PriceTable

MODEL = "priced-model"
PRICES = PriceTable.from_mapping({MODEL: {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}})


def rendered(reporter: ProgressReporter) -> str:
    """The bar as the terminal would show it now, as plain text."""
    renderable = reporter.renderable()
    assert renderable is not None
    console = Console(file=StringIO(), record=True, width=200, color_system=None)
    console.print(renderable)
    return " ".join(console.export_text().split())


def attempt(ledger: UsageLedger, task_id: str, input_tokens: int, output_tokens: int, model: str = MODEL) -> None:
    ledger.attempt(
        call=ledger.next_call_id(),
        provider="emulator",
        protocol="anthropic",
        model=model,
        task_id=task_id,
        agent="main",
        turn=1,
        attempt=1,
        key=None,
        started=0.0,
        latency_s=0.0,
        usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens),
    )


def outcome(task_id: str, *, correct: bool | None = True, status: str = COMPLETED, tokens: int = 0) -> TaskOutcome:
    return TaskOutcome(
        task_id=task_id,
        status=status,
        answer="1" if status == COMPLETED else None,
        ground_truth="1",
        correct=correct,
        turns=1,
        usage=Usage(input_tokens=tokens),
    )


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[UsageLedger]:
    ledger = UsageLedger(tmp_path / "usage.jsonl", prices=PRICES, user="tester")
    yield ledger
    ledger.close()


def reporter_for(reader: Any) -> Iterator[ProgressReporter]:
    reporter = ProgressReporter(
        console=Console(file=StringIO(), width=200), ledger=reader, auto_refresh=False, plain=False
    )
    try:
        yield reporter
    finally:
        reporter.stop()


@pytest.fixture(params=["same process", "file tail"])
def reporter(request: pytest.FixtureRequest, writer: UsageLedger) -> Iterator[ProgressReporter]:
    """The one-process run reads the ledger it writes; the parent of worker processes re-reads the file."""
    reader = writer if request.param == "same process" else LedgerTail(writer.path or "")
    yield from reporter_for(reader)


def test_running_tasks_and_cost_so_far_update_before_any_task_ends(
    reporter: ProgressReporter, writer: UsageLedger
) -> None:
    reporter.start(total=3, already=[])
    reporter.task_started("a")
    reporter.task_started("b")
    bar = rendered(reporter)
    assert "0/3" in bar and "running 2" in bar and "acc -" in bar and "failed 0" in bar
    assert "tokens 0 cost $0.0000" in bar
    assert re.search(r"eta -:--:--", bar), bar  # no task finished: no speed to estimate from

    attempt(writer, "a", 1000, 100)  # 1000 x $3/M + 100 x $15/M
    bar = rendered(reporter)
    assert "tokens 1,100 cost $0.0045" in bar
    assert "0/3" in bar and "running 2" in bar, "no task ended yet"

    attempt(writer, "b", 2000, 0)
    writer.write({"type": "call", "call": 2, "provider": "emulator", "outcome": "ok"})  # not an attempt
    assert "tokens 3,100 cost $0.0105" in rendered(reporter)

    reporter.task_done(outcome("a"))
    bar = rendered(reporter)
    assert "1/3" in bar and "running 1" in bar and "acc 100.0%" in bar
    assert "tokens 3,100 cost $0.0105" in bar, "the spend comes from the ledger, not from finished tasks"
    assert re.search(r"eta (-:--:--|\d+:\d\d:\d\d)", bar), bar


def test_failed_attempts_cost_nothing_and_failed_tasks_are_counted(
    reporter: ProgressReporter, writer: UsageLedger
) -> None:
    reporter.start(total=2, already=[])
    reporter.task_started("a")
    writer.write(
        {"type": "attempt", "task_id": "a", "outcome": "rate_limit", "usage": {"input_tokens": 500}, "cost_usd": 0.0}
    )
    assert "tokens 0 cost $0.0000" in rendered(reporter)
    reporter.task_done(outcome("a", correct=False, status=FAILED))
    bar = rendered(reporter)
    assert "1/2" in bar and "running 0" in bar and "acc 0.0%" in bar and "failed 1" in bar


def test_failed_counts_what_the_summary_counts(reporter: ProgressReporter) -> None:
    """A task a limit ended or the budget stopped is not failed, in the bar as in summary.json."""
    reporter.start(total=3, already=[])
    for task, status in (("limited", LIMIT), ("stopped", BUDGET), ("broken", FAILED)):
        reporter.task_started(task)
        reporter.task_done(outcome(task, correct=False, status=status))
    bar = rendered(reporter)
    assert "3/3" in bar and "failed 1" in bar


def test_a_resumed_run_starts_from_the_tasks_already_done(reporter: ProgressReporter, writer: UsageLedger) -> None:
    attempt(writer, "old", 100, 0)  # spent by the earlier session: the ledger is appended across sessions
    reporter.start(total=4, already=[outcome("old"), outcome("old-2", correct=False)])
    bar = rendered(reporter)
    assert "2/4" in bar and "running 0" in bar and "acc 50.0%" in bar and "tokens 100 cost $0.0003" in bar


def test_a_line_still_being_written_counts_once_it_is_whole(writer: UsageLedger) -> None:
    assert writer.path is not None
    for reporter in reporter_for(LedgerTail(writer.path)):
        reporter.start(total=1, already=[])
        attempt(writer, "a", 1000, 0)
        whole = writer.path.read_bytes()
        writer.path.write_bytes(whole[:-1])  # the same line, its newline not yet written
        assert "tokens 0 cost $0.0000" in rendered(reporter)
        with writer.path.open("ab") as fh:
            fh.write(b"\n")
        assert "tokens 1,000 cost $0.0030" in rendered(reporter)
        assert "tokens 1,000 cost $0.0030" in rendered(reporter), "a line is counted once, however often drawn"


def test_an_unpriced_model_and_no_ledger(tmp_path: Path) -> None:
    with UsageLedger(tmp_path / "usage.jsonl", prices=PRICES, user="tester") as ledger:
        for reporter in reporter_for(ledger):
            reporter.start(total=1, already=[])
            attempt(ledger, "a", 10, 0, model="no-price-for-this")
            assert "tokens 10 cost unpriced" in rendered(reporter)
    # Without a ledger the tokens are the finished tasks' own counts.
    for reporter in reporter_for(None):
        reporter.start(total=2, already=[])
        reporter.task_done(outcome("a", tokens=42))
        bar = rendered(reporter)
        assert "tokens 42" in bar and "cost" not in bar


def test_a_disabled_reporter_draws_nothing(tmp_path: Path) -> None:
    console = Console(file=StringIO(), record=True)
    reporter = ProgressReporter(console=console, enabled=False)
    reporter.start(total=1, already=[])
    reporter.task_started("a")
    reporter.status("starting")
    reporter.task_done(outcome("a"))
    reporter.stop()
    assert reporter.renderable() is None and console.export_text() == ""
    assert (reporter.done, reporter.correct, reporter.running) == (1, 1, 0)


class FakeClock:
    """The reporter's clock, moved by the test: which lines are written depends on nothing else."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain_reporter(clock: FakeClock, ledger: Any = None) -> tuple[ProgressReporter, StringIO]:
    stream = StringIO()
    console = Console(file=StringIO())  # not a terminal: plain lines, no bar
    reporter = ProgressReporter(console=console, ledger=ledger, interval_s=10.0, clock=clock, stream=stream)
    return reporter, stream


def test_off_a_terminal_plain_lines_at_the_first_end_then_at_most_one_per_interval_plus_the_last() -> None:
    clock = FakeClock()
    reporter, stream = plain_reporter(clock)
    reporter.start(total=5, already=[])
    assert reporter.renderable() is None  # no bar
    for task_id in "abcde":
        reporter.task_started(task_id)
    reporter.task_done(outcome("a", tokens=10))  # the first end: a line
    clock.now += 3
    reporter.task_done(outcome("b", correct=False))  # 3 s later: held back
    clock.now += 3
    reporter.task_done(outcome("c", correct=None))  # 6 s after the last line: held back (unscored)
    clock.now += 5
    reporter.task_done(outcome("d", status=FAILED, correct=False))  # 11 s: a line
    clock.now += 1
    reporter.task_done(outcome("e"))  # the last task: a line, whatever the interval
    reporter.stop()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "flowllm: progress: tasks 1/5 done, 4 running, accuracy 100.0% (1/1 scored), tokens 10, cost not known, "
        "elapsed 0s, eta 0s",
        "flowllm: progress: tasks 4/5 done, 1 failed, 1 running, accuracy 33.3% (1/3 scored), tokens 10, "
        "cost not known, elapsed 11s, eta 3s",
        "flowllm: progress: tasks 5/5 done, 1 failed, 0 running, accuracy 50.0% (2/4 scored), tokens 10, "
        "cost not known, elapsed 12s, eta 0s",
    ]


def test_off_a_terminal_a_held_back_end_is_written_when_the_run_stops(writer: UsageLedger) -> None:
    clock = FakeClock()
    reporter, stream = plain_reporter(clock, ledger=writer)
    reporter.start(total=4, already=[outcome("old")])  # resumed: the ETA counts only this session's pace
    reporter.task_started("a")
    reporter.task_started("b")
    attempt(writer, "a", 1000, 200)
    clock.now += 20
    reporter.task_done(outcome("a"))
    clock.now += 2
    reporter.task_done(outcome("b", correct=None))  # held back, then written by stop (an interrupted run)
    reporter.stop()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("flowllm: progress: tasks 2/4 done, 1 running, accuracy 100.0% (2/2 scored)")
    assert "tokens 1,200, cost $0.0060, elapsed 20s, eta 40s" in lines[0]
    assert lines[1].startswith("flowllm: progress: tasks 3/4 done, 0 running, accuracy 100.0% (2/2 scored)")
    assert lines[1].endswith("elapsed 22s, eta 11s")


def test_off_a_terminal_nothing_scored_says_not_known() -> None:
    clock = FakeClock()
    reporter, stream = plain_reporter(clock)
    reporter.start(total=1, already=[])
    reporter.task_started("a")
    reporter.task_done(outcome("a", correct=None))
    reporter.stop()
    assert "accuracy not known (0 scored)" in stream.getvalue()
    assert len(stream.getvalue().splitlines()) == 1
