"""Progress of a run: tasks done and running, accuracy, tokens and cost so far, elapsed time, ETA.

On a terminal it is a rich bar. Tokens and cost follow every model call: the bar reads the usage ledger's new
lines at each refresh, so a long task's spending shows while it runs, not when it ends. While the bar is live,
log records are printed through the same rich console (above the bar) instead of straight to stderr, which would
garble it.

When stderr is not a terminal (nohup, SLURM, a redirect to a file) there is no bar: one plain line is written at
the first task end and then at task ends at most once per ``experiment.progress_interval_s``, plus one for the
last task, so a log file shows how the run goes without a bar wrapped over several lines. The clock is injected,
so what is written does not depend on timing in tests.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console, RenderableType
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from flowllm.core.types import Usage
from flowllm.run.outcome import FAILED
from flowllm.rundir.results import LedgerLine
from flowllm.scoring.tally import is_finished

if TYPE_CHECKING:
    from flowllm.run.outcome import TaskOutcome
    from flowllm.spend.projection import Projector


class LedgerTally:
    """Running totals of usage ledgers' attempt lines (the agent's, the judge's), read incrementally (a ledger
    only appends)."""

    def __init__(self, ledger: Any = None, *more: Any) -> None:
        self.ledger = ledger
        self._ledgers = [lg for lg in (ledger, *more) if lg is not None]
        self._seen = [0] * len(self._ledgers)
        self.tokens = 0
        self.cost_usd = 0.0
        self.priced = True
        self.calls = 0
        # The bar's refresh thread polls, and so may anyone who renders the bar: a line is counted once.
        self._lock = threading.Lock()

    def poll(self) -> None:
        with self._lock:
            for index, ledger in enumerate(self._ledgers):
                lines = getattr(ledger, "lines", None)
                if lines is None:
                    continue
                end = len(lines)
                for line in lines[self._seen[index] : end]:
                    self._count(line)
                self._seen[index] = end

    def _count(self, line: LedgerLine) -> None:
        if line.type != "attempt" or not line.billed:
            return
        usage = Usage.from_dict(line.usage)
        self.calls += line.ok  # answered calls; an unusable reply's bill counts all the same
        self.tokens += int(usage.input_tokens or 0) + int(usage.output_tokens or 0)
        if line.cost_usd is None:
            self.priced = False
        else:
            self.cost_usd += float(line.cost_usd)


class _SpendColumn(ProgressColumn):
    """Tokens and cost billed so far, fresh at every refresh."""

    def __init__(self, tally: LedgerTally, fallback_tokens: Any) -> None:
        super().__init__()
        self.tally = tally
        self.fallback_tokens = fallback_tokens

    def render(self, task: Any) -> Text:
        self.tally.poll()
        if self.tally.ledger is None:
            return Text(f"tokens {self.fallback_tokens():,}")
        cost = f"${self.tally.cost_usd:,.4f}" if self.tally.priced else "unpriced"
        return Text(f"tokens {self.tally.tokens:,} cost {cost}")


def _duration(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h02m``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class _ProjectionColumn(ProgressColumn):
    """The run's projected total cost, tokens and time at the current rate (flowllm/spend/projection.py)."""

    def __init__(self, projector: Projector) -> None:
        super().__init__()
        self.projector = projector

    def render(self, task: Any) -> Text:
        projection = self.projector.projection()
        return Text(projection.text() if projection is not None else "proj -")


class _LiveColumn(ProgressColumn):
    """A text asked for at every refresh (the run's current limit of tasks or calls at once)."""

    def __init__(self, text: Callable[[], str | None]) -> None:
        super().__init__()
        self.text = text

    def render(self, task: Any) -> Text:
        text = self.text()
        return Text(f"max_concurrent {text}" if text else "")


class ProgressReporter:
    """A rich progress bar fed by the experiment on a terminal, plain lines elsewhere; silent when disabled."""

    def __init__(
        self,
        console: Console | None = None,
        enabled: bool = True,
        ledger: Any = None,
        auto_refresh: bool = True,
        *,
        judge_ledger: Any = None,  # the judge's calls, counted in the bar's tokens and cost too
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        stream: TextIO | None = None,
        plain: bool | None = None,
        projector: Projector | None = None,
        concurrency: Callable[[], str | None] | None = None,
    ) -> None:
        self.console = console or Console(stderr=True)
        # The run's limit of tasks or calls at once as it is now (set by flowllm ctl, or found by AIMD under
        # experiment.max_concurrent=auto): shown on the bar and the plain line.
        self.concurrency = concurrency
        self.enabled = enabled
        # False: the bar is drawn only when asked (``renderable``), never by a thread of its own.
        self.auto_refresh = auto_refresh
        # Plain lines instead of a bar: when stderr is not a terminal (None: decided by the console).
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.interval_s = interval_s
        self.clock = clock
        self.stream = stream
        self.tally = LedgerTally(ledger, judge_ledger)
        self.projector = projector  # projected totals and the one over-budget warning
        self._progress: Progress | None = None
        self._bar: Any = None
        self._swapped: list[tuple[logging.Logger, logging.Handler]] = []
        self._rich_handler: logging.Handler | None = None
        self.total = 0
        self.already = 0
        self.done = 0
        self.correct = 0
        self.scored = 0  # done tasks with a score (a replayed task that diverged has none)
        self.failed = 0
        self.running = 0
        self.tokens = 0
        self._started: float | None = None
        self._last_line: float | None = None
        self._unreported = False

    def status(self, text: str) -> None:
        """A start-up line ("starting 3 tool servers..."), before the bar exists."""
        if self.enabled:
            self.console.print(f"[dim]flowllm:[/dim] {text}")

    def _accuracy(self) -> str:
        if not self.scored:
            return "-" if not self.done else "not known (0 scored)"
        return f"{self.correct / self.scored:.1%} ({self.correct}/{self.scored} scored)"

    def _fields(self) -> dict[str, Any]:
        accuracy = f"{self.correct / self.scored:.1%}" if self.scored else "-"
        return {"accuracy": accuracy, "failed": self.failed, "running": self.running}

    def start(self, total: int, already: list[TaskOutcome]) -> None:
        self.total = total
        self.already = len(already)
        for outcome in already:
            self._count(outcome)
        if self.projector is not None:
            self.projector.start(todo=total - len(already))
        self._started = self.clock()
        if not self.enabled or self.plain:
            return
        self._progress = Progress(
            TextColumn("[bold]tasks"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("running {task.fields[running]}"),
            TextColumn("acc {task.fields[accuracy]}"),
            _SpendColumn(self.tally, lambda: self.tokens),
            *([_ProjectionColumn(self.projector)] if self.projector is not None else []),
            TextColumn("failed {task.fields[failed]}"),
            *([_LiveColumn(self.concurrency)] if self.concurrency is not None else []),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
            auto_refresh=self.auto_refresh,
        )
        self._route_logging()
        self._progress.start()
        self._bar = self._progress.add_task("tasks", total=total, completed=len(already), **self._fields())

    def renderable(self) -> RenderableType | None:
        """The bar as it shows now (None before ``start``, when disabled, and after ``stop``)."""
        return self._progress.get_renderable() if self._progress is not None else None

    def line(self) -> str:
        """The plain progress line: tasks done/total, running, accuracy so far, tokens, cost, elapsed, ETA."""
        now = self.clock()
        elapsed = now - (self._started if self._started is not None else now)
        self.tally.poll()
        if self.tally.ledger is None:
            spend = f"tokens {self.tokens:,}, cost not known"
        else:
            cost = f"${self.tally.cost_usd:,.4f}" if self.tally.priced else "not known (unpriced model)"
            spend = f"tokens {self.tally.tokens:,}, cost {cost}"
        ran = self.done - self.already  # finished in this session: the pace the ETA extrapolates
        left = max(0, self.total - self.done)
        if left == 0:
            eta = "0s"
        elif ran > 0:
            eta = _duration(elapsed / ran * left)
        else:
            eta = "not known"
        failed = f", {self.failed} failed" if self.failed else ""
        shown = self.concurrency() if self.concurrency is not None else None
        limit = f" (max_concurrent {shown})" if shown else ""
        return (
            f"flowllm: progress: tasks {self.done}/{self.total} done{failed}, {self.running} running{limit}, "
            f"accuracy {self._accuracy()}, {spend}, elapsed {_duration(elapsed)}, eta {eta}"
        )

    def _write_line(self) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(self.line() + "\n")
        stream.flush()
        self._last_line = self.clock()
        self._unreported = False

    def _route_logging(self) -> None:
        """Terminal log handlers print through the live console while the bar runs (files keep theirs)."""
        handler = RichHandler(console=self.console, show_time=False, show_path=False, markup=False)
        handler.setLevel(logging.WARNING)
        self._rich_handler = handler
        root = logging.getLogger()
        for existing in list(root.handlers):
            stream = getattr(existing, "stream", None)
            if isinstance(existing, logging.StreamHandler) and stream in (sys.stderr, sys.stdout):
                root.removeHandler(existing)
                self._swapped.append((root, existing))
        root.addHandler(handler)

    def _restore_logging(self) -> None:
        root = logging.getLogger()
        if self._rich_handler is not None:
            root.removeHandler(self._rich_handler)
            self._rich_handler = None
        for logger, handler in self._swapped:
            logger.addHandler(handler)
        self._swapped.clear()

    def _count(self, outcome: TaskOutcome) -> None:
        self.done += 1
        if outcome.correct is not None and is_finished(outcome.status):  # unscored or unfinished: not counted
            self.scored += 1
            self.correct += int(outcome.correct)
        self.failed += int(outcome.status == FAILED)  # as the summary counts: not a limit or the budget
        self.tokens += outcome.usage.total_tokens

    def requeued(self, outcome: TaskOutcome) -> None:
        """A failed task requeued (flowllm ctl RUN requeue TASK): it is not done any more."""
        self.done -= 1
        if outcome.correct is not None and is_finished(outcome.status):
            self.scored -= 1
            self.correct -= int(outcome.correct)
        self.failed -= int(outcome.status == FAILED)
        self.tokens -= outcome.usage.total_tokens
        if self._progress is not None:
            self._progress.update(self._bar, advance=-1, **self._fields())

    def task_started(self, task_id: str) -> None:
        self.running += 1
        if self._progress is not None:
            self._progress.update(self._bar, **self._fields())

    def task_done(self, outcome: TaskOutcome) -> None:
        self.running = max(0, self.running - 1)
        self._count(outcome)
        if self.projector is not None:
            self.projector.task_ended()
        if self._progress is not None:
            self._progress.update(self._bar, advance=1, **self._fields())
        if not self.enabled or not self.plain:
            return
        self._unreported = True
        first = self._last_line is None
        last = self.done >= self.total
        if first or last or self.clock() - (self._last_line or 0.0) >= self.interval_s:
            self._write_line()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self.enabled and self.plain and self._unreported:  # the last task end, when it was held back
            self._write_line()
        self._restore_logging()
