"""The usage ledger: every attempt at a model call, one JSON line each, in ``<run dir>/usage.jsonl``.

Line types (``type``):

* ``attempt``: one request sent to one provider with one key: provider, protocol, model, agent, task, turn,
  the call it belongs to, attempt number, key label (never the key), outcome (``ok`` or the error kind), HTTP
  status, retry-after, latency, tokens by kind (``estimated`` when the server reported none), cost in USD
  from the price table, whether a fallback provider served it; ``epoch`` (an ``experiment.epochs`` > 1 run):
  which epoch of the task made the call.
* ``call``: how one ``send`` ended: which provider answered (or the error), how many attempts, fallback taken,
  and ``wait_s``: the call's time not spent in a request (rate limits, a resting key, back-off, breakers).
* ``skip``: a provider passed over without sending (its breaker open, no usable key, request not portable).
* ``breaker`` and ``key``: circuit-breaker transitions, key cooldowns and retirements.

Lines are appended and flushed one by one, so a crash loses nothing written before it, and a resumed run
appends to the same file. ``summary()`` gives the totals for ``summary.json``: per provider, model and agent,
fallbacks taken, breaker transitions, key use, and hourly buckets (calls, successes, failures, total and max
latency, tokens by kind) per model, agent and user (``experiment.user``, else ``$FLOWLLM_USER``, else the
login name: who spent what when a team shares a ledger; ``python -m flowllm.inspect usage RUN...`` sums them).
``UsageLedger.read(path)`` rebuilds the same summary from the file alone.
"""

from __future__ import annotations

import functools
import getpass
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import orjson

from flowllm.core.types import Usage
from flowllm.rundir.epochs import current_epoch
from flowllm.rundir.results import BILLED_FAILURES, LedgerLine

log = logging.getLogger(__name__)

TOKEN_KINDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")


class PricedModel(Protocol):
    def cost(self, usage: Usage) -> float: ...


class PriceLookup(Protocol):
    """What the ledger needs of a price table (``flowllm.spend.pricing.PriceTable`` fits)."""

    def lookup(self, model: str | None) -> PricedModel | None: ...

    def batch_factor(self, protocol: str) -> float | None: ...


def hour_bucket(ts: float) -> str:
    return _hour_text(int(ts // 3600))


@functools.lru_cache(maxsize=64)
def _hour_text(hour: int) -> str:
    """The UTC hour ``hour`` hours after the epoch, as the ledger writes it (every line of an hour shares it)."""
    return datetime.fromtimestamp(hour * 3600, UTC).strftime("%Y-%m-%dT%H:00Z")


USER_ENV = "FLOWLLM_USER"


def resolve_user(setting: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Who the ledger charges: ``experiment.user`` if set, else ``$FLOWLLM_USER``, else the login name."""
    if setting and str(setting).strip():
        return str(setting).strip()
    env = os.environ if environ is None else environ
    if env.get(USER_ENV, "").strip():
        return env[USER_ENV].strip()
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers
        return "unknown"


@dataclass
class Tally:
    """Counts of attempts, for one provider, model, agent or hourly bucket."""

    attempts: int = 0
    successes: int = 0
    failures: int = 0
    latency_s_total: float = 0.0
    latency_s_max: float = 0.0
    tokens: Counter[str] = field(default_factory=Counter)
    estimated: int = 0  # successful attempts whose token counts were estimated
    cost_usd: float = 0.0
    unpriced: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def add(self, line: LedgerLine | Mapping[str, Any]) -> None:
        line = LedgerLine.coerce(line)
        self.attempts += 1
        ok = line.ok
        self.successes += ok
        self.failures += not ok
        self.outcomes[str(line.outcome)] += 1
        latency = float(line.latency_s or 0.0)
        self.latency_s_total += latency
        self.latency_s_max = max(self.latency_s_max, latency)
        usage = Usage.from_dict(line.usage)
        for kind in TOKEN_KINDS:
            self.tokens[kind] += int(getattr(usage, kind))
        billed = line.billed
        self.estimated += bool(billed and usage.estimated)
        if line.cost_usd is None:
            self.unpriced += billed
        else:
            self.cost_usd += float(line.cost_usd)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "successes": self.successes,
            "failures": self.failures,
            "outcomes": dict(sorted(self.outcomes.items())),
            "latency_s_total": round(self.latency_s_total, 6),
            "latency_s_max": round(self.latency_s_max, 6),
            "tokens": {k: self.tokens[k] for k in TOKEN_KINDS},
            "estimated_calls": self.estimated,
            "cost_usd": round(self.cost_usd, 6),
            "unpriced_calls": self.unpriced,
        }


_Tally = Tally


def _parse_line(raw: bytes) -> LedgerLine | None:
    """One ledger line, or None if it is broken; recovers a whole line appended right after a cut one."""
    start = 0
    for _ in range(64):  # each retry starts at the next '{"', so a pathological line costs a bounded amount
        try:
            value = orjson.loads(raw[start:])
        except orjson.JSONDecodeError:
            start = raw.find(b'{"', start + 1)
            if start < 0:
                return None
            continue
        line = LedgerLine.from_dict(value) if isinstance(value, dict) else None
        return line if line is not None and isinstance(line.type, str) and line.type else None
    return None


class UsageLedger:
    """Appends ledger lines to ``path`` (None: memory only) and keeps the running totals."""

    def __init__(self, path: Path | str | None = None, *, prices: PriceLookup | None = None, user: str | None = None):
        self.path = Path(path) if path is not None else None
        self.prices = prices
        self.user = resolve_user(user)
        self.lines: list[LedgerLine] = []
        self.broken_lines: list[int] = []  # line numbers ``read`` could not parse (cut mid-write)
        self._lock = threading.Lock()
        self._calls = 0
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("ab")

    # ----- writing -----------------------------------------------------------------------------------------
    def next_call_id(self) -> int:
        with self._lock:
            self._calls += 1
            return self._calls

    def write(self, line: LedgerLine | Mapping[str, Any]) -> LedgerLine:
        """Append one line (a mapping is read as a ``LedgerLine``: its keys are written as given)."""
        record = line if isinstance(line, LedgerLine) else LedgerLine.from_dict(dict(line))
        if record.ts is None:
            record.ts = round(time.time(), 6)
        with self._lock:
            self.lines.append(record)
            if self._file is not None:
                self._file.write(orjson.dumps(record.to_dict()) + b"\n")
                self._file.flush()
        return record

    def cost(self, model: str, usage: Usage, *, batch_protocol: str | None = None) -> float | None:
        """USD of ``usage`` on ``model``; a batch call (``batch_protocol``) at the table's batch factor."""
        if self.prices is None:
            return None
        price = self.prices.lookup(model)
        if price is None:
            return None
        factor = 1.0 if batch_protocol is None else self.prices.batch_factor(batch_protocol)
        return None if factor is None else round(price.cost(usage) * factor, 8)

    def attempt(
        self,
        *,
        call: int,
        provider: str,
        protocol: str,
        model: str,
        task_id: str,
        agent: str,
        turn: int,
        attempt: int,
        key: str | None,
        started: float,
        latency_s: float,
        usage: Usage | None = None,
        error: Any = None,
        fallback: bool = False,
        limiter_wait_s: float = 0.0,
        batch: dict[str, Any] | None = None,
    ) -> LedgerLine:
        usage = usage or Usage()
        billed = error is None or str(error.kind) in BILLED_FAILURES  # as LedgerLine.billed reads it back
        if batch is not None and batch.get("billed_before"):
            usage = Usage()  # an earlier session read (and billed) this batch result: nothing new is spent
        line = LedgerLine(
            type="attempt",
            ts=round(started, 6),
            hour=hour_bucket(started),
            call=call,
            task_id=task_id,
            agent=agent,
            turn=turn,
            user=self.user,
            provider=provider,
            protocol=protocol,
            model=model,
            attempt=attempt,
            key=key,
            fallback=fallback,
            outcome="ok" if error is None else error.kind,
            status=None if error is None else error.status,
            retry_after_s=None if error is None else error.retry_after,
            error=None if error is None else str(error.message)[:500],
            latency_s=round(latency_s, 6),
            limiter_wait_s=round(limiter_wait_s, 6),  # waiting for provider.rate_limit before sending
            usage=usage.to_dict(),
            cost_usd=self.cost(model, usage, batch_protocol=protocol if batch else None) if billed else 0.0,
            # experiment.epochs > 1: which epoch of the task made the call (None: not written)
            epoch=current_epoch(),
            # answered through a batch API (flowllm/providers/batch.py)
            batch=None if batch is None else {k: batch.get(k) for k in ("id", "reused", "billed_before")},
        )
        return self.write(line)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> UsageLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- reading -----------------------------------------------------------------------------------------
    @classmethod
    def read(cls, path: Path | str) -> UsageLedger:
        """A memory-only ledger holding the lines of ``path`` (for summaries of a finished run)."""
        ledger = cls(None)
        for number, raw in enumerate(Path(path).read_bytes().splitlines(), start=1):
            if not raw.strip():
                continue
            line = _parse_line(raw)
            if line is None:
                # A line cut by a full disk or a kill mid-write; a resumed session may have appended a whole
                # line right after the cut, which _parse_line recovers. The rest of the file still counts.
                ledger.broken_lines.append(number)
                continue
            ledger.lines.append(line)
        if ledger.broken_lines:
            log.warning(
                "usage ledger %s: skipped %d unreadable line(s) (%s); the totals leave them out",
                path,
                len(ledger.broken_lines),
                ", ".join(map(str, ledger.broken_lines[:5])) + (", ..." if len(ledger.broken_lines) > 5 else ""),
            )
        return ledger

    def attempt_lines(self) -> list[LedgerLine]:
        return [line for line in self.lines if line.type == "attempt"]

    def attempts(self) -> list[dict[str, Any]]:
        """The attempt lines as JSON objects (flowllm/inspect reads them so until it moves to ``attempt_lines``)."""
        return [line.to_dict() for line in self.attempt_lines()]

    def usage(self) -> Usage:
        """Tokens of every billed attempt (answered, or answered unusably): what the run was billed for."""
        total = Usage()
        for line in self.attempt_lines():
            if line.billed:
                total = total + Usage.from_dict(line.usage)
        return total

    def summary(self) -> dict[str, Any]:
        """The ``providers`` block of ``summary.json``."""
        attempts = self.attempt_lines()
        calls = [line for line in self.lines if line.type == "call"]
        by: dict[str, dict[str, _Tally]] = {"provider": {}, "model": {}, "agent": {}}
        hourly: dict[tuple[str, str, str, str], _Tally] = {}
        total = _Tally()
        for line in attempts:
            total.add(line)
            for dim, value in (("provider", line.provider), ("model", line.model), ("agent", line.agent)):
                by[dim].setdefault(str(value), _Tally()).add(line)
            key = (str(line.hour), str(line.model), str(line.agent), line.user or "")
            hourly.setdefault(key, _Tally()).add(line)
        answered: Counter[str] = Counter(str(c.provider) for c in calls if c.ok)
        breaker: dict[str, list[dict[str, Any]]] = {}
        for line in self.lines:
            if line.type == "breaker":
                breaker.setdefault(str(line.provider), []).append(
                    {"from": line.from_state, "to": line.to_state, "reason": line.reason, "ts": line.ts}
                )
        skips: dict[str, Counter[str]] = {}
        for line in self.lines:
            if line.type == "skip":
                skips.setdefault(str(line.provider), Counter())[str(line.reason)] += 1
        keys: dict[str, Counter[str]] = {}
        for line in self.lines:
            if line.type == "key":
                keys.setdefault(f"{line.provider}/{line.key}", Counter())[str(line.event)] += 1
        providers = {}
        for name, tally in sorted(by["provider"].items()):
            entry = tally.to_dict()
            entry["answered_calls"] = answered.get(name, 0)
            providers[name] = entry
        usage = self.usage()
        return {
            "calls": len(calls),
            "calls_ok": sum(1 for c in calls if c.ok),
            "calls_failed": sum(1 for c in calls if not c.ok),
            "fallbacks_taken": sum(1 for c in calls if c.ok and c.fallback),
            "attempts": total.attempts,
            "retries": total.attempts - len(calls) if calls else 0,
            **{k: v for k, v in total.to_dict().items() if k != "attempts"},
            "usage": usage.to_dict(),
            "limiter_wait_s": round(sum(float(a.limiter_wait_s or 0.0) for a in attempts), 6),
            "by_provider": providers,
            "by_model": {k: v.to_dict() for k, v in sorted(by["model"].items())},
            "by_agent": {k: v.to_dict() for k, v in sorted(by["agent"].items())},
            "breaker_transitions": breaker,
            "skips": {k: dict(v) for k, v in sorted(skips.items())},
            "key_events": {k: dict(v) for k, v in sorted(keys.items())},
            "hourly": [
                {"hour": h, "model": m, "agent": a, "user": u, **tally.to_dict()}
                for (h, m, a, u), tally in sorted(hourly.items())
            ],
        }


class LedgerTail:
    """The lines of a ledger file that other processes append to (the workers of one run), read as they come.

    ``lines`` reads what was appended since the last look; a line still being written waits for its newline, a
    line that does not parse is skipped (a worker killed mid-write).
    """

    def __init__(self, path: Path | str, *, from_end: bool = False) -> None:
        self.path = Path(path)
        # from_end: only what is appended from now on (this session's lines of a ledger earlier sessions wrote)
        self._offset = self.path.stat().st_size if from_end and self.path.is_file() else 0
        self._partial = b""
        self._lines: list[LedgerLine] = []

    @property
    def lines(self) -> list[LedgerLine]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return self._lines
        self._offset += len(chunk)
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        for raw in complete:
            try:
                entry = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(entry, dict):
                self._lines.append(LedgerLine.from_dict(entry))
        return self._lines
