"""The run's projected total cost and time at the current rate, for the progress display; one warning when the
projection passes the run's budget (``experiment.budget``).

The rate is this session's: what the ledger gained since the session started (every worker's calls, running
tasks' included) per task ended, and the session's elapsed time per task ended. The projection is what the run's
ledger held when the session started, plus that rate times the tasks this session runs. Nothing is projected
before the first task ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from flowllm.spend.spending import RunBudget, Spend, SpendBook

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Projection:
    """The run's total at the current rate: cost (None: some model is unpriced), tokens, seconds of this session."""

    cost_usd: float | None
    tokens: int
    seconds: float

    def text(self) -> str:
        cost = f"${self.cost_usd:,.4f}" if self.cost_usd is not None else "cost not known"
        return f"proj {cost} {self.tokens:,} tok {_duration(self.seconds)}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class Projector:
    """Follows the run's ledger (``SpendBook``) and the tasks this session ends."""

    def __init__(self, book: SpendBook, budget: RunBudget, clock: Callable[[], float] = time.monotonic) -> None:
        self.book = book
        self.budget = budget
        self.clock = clock
        self.started = clock()
        self.before = Spend()
        self.todo = 0
        self.ended = 0
        self.warned = False

    def start(self, todo: int) -> None:
        """The session begins with ``todo`` tasks to run."""
        self.started = self.clock()
        self.before = self.book.total()
        self.todo = todo
        self.ended = 0

    def task_ended(self) -> None:
        self.ended += 1
        self.check()

    def projection(self) -> Projection | None:
        if self.ended < 1 or self.todo < 1:
            return None
        now = self.book.total()
        session = now.minus(self.before)
        scale = self.todo / self.ended
        cost = None if now.unpriced_calls else self.before.cost_usd + session.cost_usd * scale
        tokens = self.before.tokens + round(session.tokens * scale)
        return Projection(cost_usd=cost, tokens=tokens, seconds=(self.clock() - self.started) * scale)

    def over_budget(self, projection: Projection) -> str | None:
        """What the projection passes, in words (None: within the budget, or no budget)."""
        cap = self.budget
        if cap.cost_usd is not None and projection.cost_usd is not None and projection.cost_usd > cap.cost_usd:
            return f"${projection.cost_usd:,.4f}, above experiment.budget.cost_usd=${cap.cost_usd:g}"
        if cap.tokens is not None and projection.tokens > cap.tokens:
            return f"{projection.tokens:,} tokens, above experiment.budget.tokens={cap.tokens:,}"
        return None

    def check(self) -> None:
        """Warn once when the projection passes the budget."""
        if self.warned or not self.budget.active:
            return
        projection = self.projection()
        over = self.over_budget(projection) if projection is not None else None
        if over is not None:
            self.warned = True
            log.warning(
                "flowllm: at the current rate the run would cost %s; it will stop when the budget is spent "
                "(a rerun with a higher budget resumes)",
                over,
            )
