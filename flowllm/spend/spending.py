"""Spending caps: per-task limits (``agent.limits``) and the run's budget (``experiment.budget``).

Both are measured on the run's ledgers, the record of what was billed: every attempt of every worker process
(and Ray task) of the run is appended to ``usage.jsonl``, and the judge's calls to ``judge_usage.jsonl``, so
``SpendBook`` reads them as they grow and knows the run's spend and each task's, wherever they ran, this session
and earlier ones. ``RunBill`` is what they add up to, the agent's and the judge's apart: the run's cost.

* A per-task limit is checked after every turn (``TaskGate.after_turn``, asked by the agent loop): the task ends
  with status ``limit`` and the limit named. Tokens and cost count every model call of the task's attempt
  (sub-agents, the vision tool, compaction, tool servers' sampling included); turns count the main agent's.
  Working time is wall time minus the time the task's model calls spent waiting (rate limits, a resting key,
  retries' back-off, open breakers: the ledger's ``wait_s`` of each call; calls that waited at once each count).
* The run's budget is checked before a task starts and after every turn: once the ledger's total reaches it no
  task starts, and running tasks end after the turn in progress with status ``budget``. The budget counts the
  run directory's whole ledger, earlier sessions included, so a rerun with a higher budget spends the rest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from flowllm.core.coordination import SpendEntry
from flowllm.core.interfaces import Halt
from flowllm.core.types import Usage
from flowllm.errors import ConfigError
from flowllm.providers.ledger import LedgerTail
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import LedgerLine
from flowllm.scoring.tally import UNFINISHED_STATUS
from flowllm.spend.pricing import PriceTable

MAIN_AGENT = "main"
# Whose spend a shared budget's halt names (experiment.coordination: every process keeping it together).
SHARED_SPENDER = "the runs sharing its budget (experiment.coordination)"
STATUS_LIMIT: Final = "limit"
STATUS_BUDGET: Final = UNFINISHED_STATUS  # unfinished: counted in neither scored nor unscored


class Limit(StrEnum):
    """The per-task limits, as spelled under ``agent.limits``."""

    tokens = "tokens"  # input + output tokens
    output_tokens = "output_tokens"
    cost_usd = "cost_usd"
    turns = "turns"  # of the main agent
    wall_s = "wall_s"
    working_s = "working_s"  # wall time minus time queued behind rate limits, back-off and breakers


_WHOLE = (Limit.tokens, Limit.output_tokens, Limit.turns)


def _positive(setting: str, value: Any, whole: bool) -> float | int | None:
    """A limit's value: None (no limit) or a positive number; anything else is a one-line ConfigError."""
    if value is None:
        return None
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{setting} must be {kind} above 0 or null, not {value!r}")
    if whole and not float(value).is_integer():
        raise ConfigError(f"{setting} must be {kind} above 0 or null, not {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{setting} must be {kind} above 0 or null (no limit), not {value}")
    return int(value) if whole else float(value)


def _check_keys(section: str, given: Mapping[str, Any], known: Iterable[str]) -> None:
    unknown = sorted(set(map(str, given)) - set(known))
    if unknown:
        raise ConfigError(f"{section} has no setting {', '.join(unknown)} (known: {', '.join(sorted(known))})")


@dataclass(frozen=True)
class TaskLimits:
    """``agent.limits``: each None is no limit."""

    tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int | None = None
    wall_s: float | None = None
    working_s: float | None = None
    score_partial: bool = True  # a task ended by a limit is scored on the answer it gave (else counted wrong)

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> TaskLimits:
        given = dict(node or {})
        _check_keys("agent.limits", given, [f.name for f in fields(cls)])
        values: dict[str, Any] = {}
        for limit in Limit:
            values[limit.value] = _positive(f"agent.limits.{limit.value}", given.get(limit.value), limit in _WHOLE)
        partial = given.get("score_partial", True)
        if not isinstance(partial, bool):
            raise ConfigError(f"agent.limits.score_partial must be true or false, not {partial!r}")
        return cls(**values, score_partial=partial)

    def value(self, limit: Limit) -> float | int | None:
        result: float | int | None = getattr(self, limit.value)
        return result

    @property
    def active(self) -> bool:
        return any(self.value(limit) is not None for limit in Limit)


@dataclass(frozen=True)
class RunBudget:
    """``experiment.budget``: the most the run directory's ledger may add up to (None: no cap)."""

    cost_usd: float | None = None
    tokens: int | None = None

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> RunBudget:
        given = dict(node or {})
        _check_keys("experiment.budget", given, [f.name for f in fields(cls)])
        cost = _positive("experiment.budget.cost_usd", given.get("cost_usd"), whole=False)
        tokens = _positive("experiment.budget.tokens", given.get("tokens"), whole=True)
        return cls(cost_usd=None if cost is None else float(cost), tokens=None if tokens is None else int(tokens))

    @property
    def active(self) -> bool:
        return self.cost_usd is not None or self.tokens is not None

    def reached(self, spend: Spend, spender: str = "the run") -> Halt | None:
        """The budget's halt when ``spend`` (``spender``'s: the run's) has reached it."""
        if self.cost_usd is not None and spend.cost_usd >= self.cost_usd:
            return Halt(
                STATUS_BUDGET,
                detail=f"{spender} spent ${spend.cost_usd:.4f} of its ${self.cost_usd:g} (experiment.budget.cost_usd)",
            )
        if self.tokens is not None and spend.tokens >= self.tokens:
            return Halt(
                STATUS_BUDGET,
                detail=f"{spender} used {spend.tokens:,} tokens of its {self.tokens:,} (experiment.budget.tokens)",
            )
        return None

    def reached_by(self, book: SpendBook) -> Halt | None:
        """The budget's halt when the run's spend (``book``'s total) has reached it. A spend that cannot be read
        now (the Redis that keeps it under experiment.coordination went away) halts the task too: unfinished, for
        a rerun, rather than run on without knowing what the run spent."""
        try:
            total = book.total()
        except OSError as exc:
            return Halt(STATUS_BUDGET, detail=f"the run's spend cannot be read: {exc}")
        return self.reached(total, book.spender)


@dataclass
class Spend:
    """What some model calls were billed (every billed attempt: ``LedgerLine.billed``) and how long they waited."""

    tokens: int = 0  # input + output
    output_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0  # billed attempts with no price (their cost is not in cost_usd)
    wait_s: float = 0.0  # the calls' time spent not sending (ledger call lines' wait_s)

    def add_attempt(self, line: LedgerLine) -> None:
        if not line.billed:
            return
        usage = Usage.from_dict(line.usage)
        self.tokens += usage.input_tokens + usage.output_tokens
        self.output_tokens += usage.output_tokens
        cost = line.cost_usd
        if cost is None:
            self.unpriced_calls += 1
        else:
            self.cost_usd += float(cost)

    def minus(self, before: Spend) -> Spend:
        return Spend(
            tokens=self.tokens - before.tokens,
            output_tokens=self.output_tokens - before.output_tokens,
            cost_usd=self.cost_usd - before.cost_usd,
            unpriced_calls=self.unpriced_calls - before.unpriced_calls,
            wait_s=self.wait_s - before.wait_s,
        )

    def copy(self) -> Spend:
        return Spend(self.tokens, self.output_tokens, self.cost_usd, self.unpriced_calls, self.wait_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": round(self.cost_usd, 6) if not self.unpriced_calls else None,
        }


class SharedSpend(Protocol):
    """The run's spend kept where processes that share no ledger see it (``flowllm.core.coordination.RedisSpend``):
    ``add`` counts billed lines not counted before (by digest) and returns the run's totals."""

    def add(self, entries: Sequence[SpendEntry]) -> dict[str, float]: ...


class SpendBook:
    """Ledgers, read as every process appends to them: their spend and each task's. With ``shared`` the run's
    total is the shared one (every process's billed lines, pushed as this process reads its ledger)."""

    def __init__(self, *paths: Path | str, shared: SharedSpend | None = None) -> None:
        self._tails = [LedgerTail(path) for path in paths]
        self._seen = [0] * len(paths)
        self._total = Spend()
        self._tasks: dict[str, Spend] = {}
        self.shared = shared
        self._unshared: list[SpendEntry] = []

    @property
    def spender(self) -> str:
        """Whose spend ``total`` is, as a halt's reason says it."""
        return "the run" if self.shared is None else SHARED_SPENDER

    @classmethod
    def of_run(cls, run_dir: Path | str, shared: SharedSpend | None = None) -> SpendBook:
        """The run's ledgers: the agent's calls (every process's) and the judge's."""
        layout = RunLayout(Path(run_dir))
        return cls(layout.ledger, layout.judge_ledger, shared=shared)

    def refresh(self) -> None:
        for index, tail in enumerate(self._tails):
            lines = tail.lines
            for line in lines[self._seen[index] :]:
                self._add(line)
            self._seen[index] = len(lines)

    def _add(self, line: LedgerLine) -> None:
        kind = line.type
        task = line.task_id
        if kind == "attempt":
            self._total.add_attempt(line)
            if self.shared is not None and line.billed:
                self._unshared.append(_entry(line))
            if task is not None:
                self._tasks.setdefault(str(task), Spend()).add_attempt(line)
        elif kind == "call" and task is not None:
            self._tasks.setdefault(str(task), Spend()).wait_s += float(line.wait_s or 0.0)

    def total(self) -> Spend:
        self.refresh()
        if self.shared is None:
            return self._total.copy()
        totals = self.shared.add(self._unshared)
        self._unshared = []
        return Spend(
            tokens=int(totals.get("tokens", 0)),
            output_tokens=int(totals.get("output_tokens", 0)),
            cost_usd=float(totals.get("cost_usd", 0.0)),
            unpriced_calls=int(totals.get("unpriced_calls", 0)),
        )

    def task(self, task_id: str) -> Spend:
        self.refresh()
        return self._tasks.get(task_id, Spend()).copy()


def _entry(line: LedgerLine) -> SpendEntry:
    """A billed line as the shared spend counts it: once, by the digest of what it says."""
    one = Spend()
    one.add_attempt(line)
    raw = orjson.dumps(line.to_dict(), option=orjson.OPT_SORT_KEYS)
    return SpendEntry(SpendEntry.digest_of(raw), one.tokens, one.output_tokens, one.cost_usd, one.unpriced_calls > 0)


@dataclass(frozen=True)
class RunBill:
    """What a run folder's ledgers say was billed, every session and attempt: the agent's calls and the judge's."""

    agent: Spend
    judge: Spend

    @classmethod
    def read(cls, run_dir: Path | str) -> RunBill:
        layout = RunLayout(Path(run_dir))
        return cls(SpendBook(layout.ledger).total(), SpendBook(layout.judge_ledger).total())

    @property
    def cost_usd(self) -> float | None:
        """The run's cost; None (not known) when a billed call had no price."""
        if self.agent.unpriced_calls or self.judge.unpriced_calls:
            return None
        return round(self.agent.cost_usd + self.judge.cost_usd, 6)

    @property
    def tokens(self) -> int:
        return self.agent.tokens + self.judge.tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_usd": self.cost_usd,
            "agent_usd": self.agent.to_dict()["cost_usd"],
            "judge_usd": self.judge.to_dict()["cost_usd"],
            "tokens": self.tokens,
            "judge_tokens": self.judge.tokens,
        }


class TaskGate:
    """One attempt at one task: the per-task limits and the run's budget, asked after every turn.

    The attempt's spend is the task's ledger lines since the gate was made (an earlier attempt's, or an
    earlier session's, are not this attempt's)."""

    def __init__(
        self,
        task_id: str,
        book: SpendBook,
        limits: TaskLimits,
        budget: RunBudget,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task_id = task_id
        self.book = book
        self.limits = limits
        self.budget = budget
        self.clock = clock
        self.started = clock()
        self.baseline = book.task(task_id)
        self.turns = 0  # of the main agent

    def spent(self) -> Spend:
        return self.book.task(self.task_id).minus(self.baseline)

    async def before_turn(self) -> None:
        return None

    def after_turn(self, agent: str, turns: int, scope: str = "") -> Halt | None:
        if agent == MAIN_AGENT:
            self.turns = turns
        if self.budget.active:
            halt = self.budget.reached_by(self.book)
            if halt is not None:
                return halt
        if not self.limits.active:
            return None
        spend = self.spent()
        wall = self.clock() - self.started
        measured: dict[Limit, float | int] = {
            Limit.tokens: spend.tokens,
            Limit.output_tokens: spend.output_tokens,
            Limit.cost_usd: spend.cost_usd,
            Limit.turns: self.turns,
            Limit.wall_s: wall,
            Limit.working_s: max(0.0, wall - spend.wait_s),
        }
        for limit in Limit:
            cap = self.limits.value(limit)
            if cap is not None and measured[limit] >= cap:
                return Halt(
                    STATUS_LIMIT,
                    limit.value,
                    f"{limit.value} reached {_shown(limit, measured[limit])} "
                    f"(limit {_shown(limit, cap)}, agent.limits.{limit.value})",
                )
        return None


def _shown(limit: Limit, value: float | int) -> str:
    if limit is Limit.cost_usd:
        return f"${value:.4f}"
    if limit in (Limit.wall_s, Limit.working_s):
        return f"{value:.1f}s"
    return f"{int(value):,}"


def unpriced_models(models: Iterable[str], prices: PriceTable) -> list[str]:
    """The models of ``models`` the price table has no price for (in order, once each)."""
    return [m for m in dict.fromkeys(models) if m and prices.lookup(m) is None]


def refuse_unpriced(models: Iterable[str], prices: PriceTable, limits: TaskLimits, budget: RunBudget) -> None:
    """A cost cap cannot be kept on a model whose calls cost nothing known: refused before the first task."""
    settings = [
        name
        for name, on in (
            ("experiment.budget.cost_usd", budget.cost_usd is not None),
            ("agent.limits.cost_usd", limits.cost_usd is not None),
        )
        if on
    ]
    if not settings:
        return
    missing = unpriced_models(models, prices)
    if missing:
        raise ConfigError(
            f"{' and '.join(settings)} cannot be kept: no price for model {', '.join(repr(m) for m in missing)} "
            f"in {prices.source} (add it there, or drop the cost cap)"
        )
