"""Adaptive concurrency: how many calls a provider's model gets at once, learnt from how it answers (AIMD).

``experiment.max_concurrent=auto`` (or ``auto:N`` for a ceiling of N, default 64) runs up to the ceiling's tasks,
and each provider and model gets a limit of calls in flight that

* grows by one per window of answers (one call more for every ``limit`` calls answered well: additive
  increase, as TCP's congestion window grows by one segment per round trip); until the first cut it grows by
  one per answer (it doubles per round trip: TCP's slow start), so a start far below the provider's capacity
  reaches it in a few round trips;
* is cut on a 429 (rate limit) or an overload error (529, 503) (multiplicative decrease): to 85% of the calls
  the provider answered well within the last round trip (what it serves at once, measured; the 15% let its
  quota's bucket refill), at most 90% and at least half of the limit (half when nothing was answered yet: a
  start far above the provider's capacity). Once per congestion episode (as TCP): a call sent before the last
  cut (each call carries the number of cuts when it was admitted) or within a round trip after it (the
  provider's quota had not refilled yet) does not cut again; each such 429 takes one call off the limit (not
  below a quarter of the limit the episode began at). After a cut it holds for three round trips before it
  grows again, and near the limit of the last cut (90% of it and above) it grows four times slower: each probe
  past the provider's edge costs 429s, so it probes rarely;
* is cut by a tenth when latency rises: the recent latency (an average over the last calls) above twice the
  best recent latency means the provider queues the calls instead of serving them.

Calls start paced (``AdaptiveFlight``): at most 1.5 times the limit per round trip, so answers that come back
together do not send their successors in a clump that an empty quota refuses whole. Until a first call has been
answered there is no round trip to pace by, so that call goes alone. A call's latency is timed
from the end of the limiter's waits (flowllm/providers/limiter.py sets ``Ticket.started``).

The limit lives in a ``LimitStore``: this process's memory, or, under ``experiment.workers=N``, a small file per
provider and model beside the shared 429 pauses (``SharedLimitFile``), so every worker reads and moves the one
limit of the run; a worker admits its 1/N share of it. Under ``experiment.coordination=redis://...`` the limit is
one Redis key per provider and model (``SharedLimitValue``), so the processes of every machine of the run move
the one limit (each is one worker of its own: it admits the limit as Redis holds it). A 429's Retry-After pause
is the limiter's own (flowllm/providers/limiter.py): this only decides how many calls may be in flight.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

DEFAULT_CEILING = 64
START = 4.0  # the first limit (below the ceiling): a run starts gently and grows
DECREASE = 0.5  # the deepest cut on a 429 or an overload error (and the cut when nothing was answered yet)
SHALLOW = 0.9  # the shallowest: the limit was just above what the provider serves
BELOW_SERVED = 0.85  # a cut goes this far below what the provider served: its quota's bucket refills meanwhile
HOLD_ROUND_TRIPS = 3.0  # after a cut the limit holds this many round trips before it grows again
NEAR_PEAK = 0.9  # above this share of the limit of the last cut, the limit probes slowly
PROBE_SLOWDOWN = 4.0  # there it grows one call per this many windows of answers (the provider's edge is near)
LATENCY_DECREASE = 0.9  # the factor when latency rises
LATENCY_FACTOR = 2.0  # recent latency above this many times the best recent latency: the provider is queueing
LATENCY_SAMPLES = 8  # answers seen before latency may cut
RECENT = 0.2  # weight of the newest answer in the recent latency
PACE_GAIN = 1.5  # calls start at most this many times the limit's rate (limit per round trip), never in clumps
BASELINE_DRIFT = 0.02  # how fast the best latency forgets (so a slower model after a change is not "congested")


@dataclass(frozen=True)
class AdaptiveSettings:
    """``experiment.max_concurrent=auto[:ceiling]`` as the providers need it."""

    ceiling: int = DEFAULT_CEILING
    workers: int = 1  # the run's worker processes: each admits its share of the run's limit
    shared_dir: Path | None = None  # where the workers' limits meet (the run's shared 429 pauses folder)
    # where the limits of the run's machines meet (experiment.coordination): a shared value by name
    shared_value: Callable[[str], SharedText] | None = None
    start: float = START


def parse_auto(value: object) -> int | None:
    """The ceiling of ``auto`` / ``auto:N`` (None: not auto). ValueError for ``auto:`` with no whole number."""
    if not isinstance(value, str) or not value.strip().lower().startswith("auto"):
        return None
    text = value.strip().lower()
    if text == "auto":
        return DEFAULT_CEILING
    head, _, ceiling = text.partition(":")
    if head != "auto" or not ceiling.isdigit() or int(ceiling) < 1:
        raise ValueError(f"experiment.max_concurrent must be a whole number, auto or auto:N (N >= 1), not {value!r}")
    return int(ceiling)


@dataclass
class LimitState:
    limit: float
    cuts: int = 0  # how many times the limit was cut (a call admitted before the last cut cannot cut again)


class LimitStore(Protocol):
    def load(self) -> LimitState: ...

    def save(self, state: LimitState) -> None: ...


@dataclass
class MemoryLimit:
    """The limit of one process."""

    state: LimitState

    def load(self) -> LimitState:
        return LimitState(self.state.limit, self.state.cuts)

    def save(self, state: LimitState) -> None:
        self.state = LimitState(state.limit, state.cuts)


@dataclass
class SharedLimitFile:
    """The limit of a run's workers, in one small file (``<limit> <cuts>``, replaced by rename): read again when
    it changed. Two workers moving it at once may lose one's step; the next answer moves it again."""

    path: Path
    initial: LimitState
    _seen: tuple[int, int, int] | None = None
    _cached: LimitState | None = None

    def load(self) -> LimitState:
        try:
            info = self.path.stat()
        except OSError:
            return LimitState(self.initial.limit, self.initial.cuts) if self._cached is None else self._cached
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if stamp != self._seen or self._cached is None:
            with contextlib.suppress(OSError, ValueError):
                limit, cuts = self.path.read_text(encoding="ascii").split()
                self._cached, self._seen = LimitState(float(limit), int(cuts)), stamp
        return self._cached or LimitState(self.initial.limit, self.initial.cuts)

    def save(self, state: LimitState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{state.limit:.4f} {state.cuts}", encoding="ascii")
        os.replace(tmp, self.path)
        self._cached = LimitState(state.limit, state.cuts)


class SharedText(Protocol):
    """One short value every process of a run reads and replaces (a key in Redis)."""

    def get(self) -> str | None: ...

    def set(self, text: str) -> None: ...


REFRESH_S = 0.25  # how stale a limit read from a shared value may be (each read is a round trip to the server)


@dataclass
class SharedLimitValue:
    """The limit of a run's processes on several machines, in a shared value (``<limit> <cuts>``), read again at
    most every ``REFRESH_S``. As with ``SharedLimitFile``, two processes moving it at once may lose one's step;
    an unreachable server keeps the last value read (the run goes on with it)."""

    value: SharedText
    initial: LimitState
    clock: Callable[[], float] = time.monotonic
    _cached: LimitState | None = None
    _read_at: float = -math.inf

    def load(self) -> LimitState:
        now = self.clock()
        if self._cached is None or now - self._read_at >= REFRESH_S:
            self._read_at = now
            with contextlib.suppress(OSError, ValueError):
                text = self.value.get()
                if text is not None:
                    limit, cuts = text.split()
                    self._cached = LimitState(float(limit), int(cuts))
        found = self._cached or self.initial
        return LimitState(found.limit, found.cuts)

    def save(self, state: LimitState) -> None:
        with contextlib.suppress(OSError):
            self.value.set(f"{state.limit:.4f} {state.cuts}")
        self._cached, self._read_at = LimitState(state.limit, state.cuts), self.clock()


@dataclass
class Ticket:
    """One admitted call: when it was admitted, and the number of cuts then."""

    started: float
    cuts: int


@dataclass
class AimdController:
    """The limit of one provider and model: ``admit`` before a call, then ``answered`` or ``overloaded``."""

    ceiling: int
    store: LimitStore
    clock: Callable[[], float] = time.monotonic
    workers: int = 1  # processes moving the one limit: each sees its share of the answers
    recent_s: float | None = None  # the recent latency (an average weighted to the newest)
    best_s: float | None = None  # the best recent latency, forgetting slowly
    samples: int = 0
    cut_at: float | None = None  # when this process last cut the limit
    peak: float | None = None  # the limit this process last cut from: the provider's edge, as last found
    answers: collections.deque[float] = field(default_factory=collections.deque)  # when calls were answered well

    @property
    def limit(self) -> float:
        return self.store.load().limit

    def admit(self) -> Ticket:
        return Ticket(self.clock(), self.store.load().cuts)

    def answered(self, ticket: Ticket) -> None:
        """An answer: the limit grows by 1/limit (one per window of answers), unless latency says queueing."""
        now = self.clock()
        latency = max(now - ticket.started, 0.0)
        self.answers.append(now)
        self.samples += 1
        self.recent_s = latency if self.recent_s is None else self.recent_s + RECENT * (latency - self.recent_s)
        if self.best_s is None or self.recent_s < self.best_s:
            self.best_s = self.recent_s
        else:
            self.best_s += BASELINE_DRIFT * (self.recent_s - self.best_s)
        if self.samples >= LATENCY_SAMPLES and self.recent_s > LATENCY_FACTOR * max(self.best_s, 1e-3):
            self._cut(ticket, LATENCY_DECREASE)
            return
        state = self.store.load()
        if self.cut_at is not None and now - self.cut_at < HOLD_ROUND_TRIPS * self.recent_s:
            return  # just cut: the provider's quota refills before the limit probes it again
        step = 1.0 if state.cuts == 0 else 1.0 / max(state.limit, 1.0)  # slow start until the first cut
        if self.peak is not None and state.limit >= NEAR_PEAK * self.peak:
            step /= PROBE_SLOWDOWN  # near the edge the last cut found: probe it gently (few 429s per probe)
        grown = min(float(self.ceiling), state.limit + step)
        if grown != state.limit:
            self.store.save(LimitState(grown, state.cuts))

    def served(self) -> float:
        """Calls answered well within the last round trip (the recent latency), the run's (all workers')."""
        if self.recent_s is None:
            return 0.0
        since = self.clock() - self.recent_s
        while self.answers and self.answers[0] < since:
            self.answers.popleft()
        return float(len(self.answers) * self.workers)

    def overloaded(self, ticket: Ticket) -> None:
        """A 429 or an overload error: the limit is cut to what the provider serves (from half to 90% of it),
        once for the calls sent at the same limit."""
        state = self.store.load()
        served = self.served()
        target = DECREASE if served < 1 else min(SHALLOW, max(BELOW_SERVED * served / state.limit, DECREASE))
        self._cut(ticket, target)

    def _cut(self, ticket: Ticket, factor: float) -> None:
        state = self.store.load()
        same_episode = ticket.cuts < state.cuts  # sent before the last cut: that cut already answered it
        if self.cut_at is not None and self.recent_s is not None and ticket.started < self.cut_at + self.recent_s:
            same_episode = True  # sent within a round trip of the cut: the provider's quota had not refilled yet
        if same_episode:
            if self.peak is not None and factor < 1.0:  # each further refusal: one call fewer in flight
                floor = max(1.0, self.peak * DECREASE * DECREASE)
                if state.limit - 1.0 >= floor:
                    self.store.save(LimitState(state.limit - 1.0, state.cuts))
            return
        self.cut_at = self.clock()
        self.peak = state.limit
        self.store.save(LimitState(max(1.0, state.limit * factor), state.cuts + 1))


@dataclass
class AdaptiveFlight:
    """The calls in flight of one provider and model in this process, held under its controller's limit (this
    worker's share of it). Waiters are woken in order as calls end, retries first."""

    controller: AimdController
    workers: int = 1
    in_flight: int = 0
    next_start: float = 0.0  # clock time before which no further call starts (pacing)
    _waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)

    def allowed(self) -> int:
        """This process's calls at once: its share of the limit (at least one); one alone until a call has been
        answered (TCP's initial window): a start far above the provider's quota would send a burst it refuses
        whole before the first 429 could cut, and the first answer's round trip is what later calls are paced by."""
        if self.controller.recent_s is None:
            return 1
        return max(1, math.floor(self.controller.limit / self.workers))

    async def acquire(self, *, retry: bool = False) -> Ticket:
        """A slot, in turn; a ``retry`` (a call sent again after a failed attempt: a 429, an overload, a 5xx) goes
        before the first tries waiting: behind them it could be refused again and again until it ran out of
        attempts."""
        while self.in_flight >= self.allowed() or self._waiters:
            waiter = asyncio.get_running_loop().create_future()
            if retry:
                self._waiters.appendleft(waiter)
            else:
                self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                self._wake()  # it may have been woken for a slot it will not take: the next one takes it
                raise
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            if self.in_flight < self.allowed():
                break
        self.in_flight += 1
        self._wake()
        await self._pace()
        return self.controller.admit()

    async def _pace(self) -> None:
        """Calls start spread over a round trip (TCP's pacing): answers that come back together would otherwise
        send their successors together, and a clump that meets a provider's empty quota is answered 429 whole
        before the first 429 can cut the limit."""
        round_trip = self.controller.recent_s
        if not round_trip:
            return  # nothing answered yet: no round trip to spread over
        gap = round_trip / (PACE_GAIN * max(self.controller.limit / self.workers, 1.0))
        clock = self.controller.clock
        now = clock()
        start = max(now, self.next_start)
        self.next_start = start + gap
        if start > now:
            try:
                await asyncio.sleep(start - now)
            except asyncio.CancelledError:
                self._free()
                raise

    def release(self, ticket: Ticket, overloaded: bool | None) -> None:
        """``overloaded``: True for a 429 or an overload error, False for an answer, None when the call said
        nothing of the provider's load (a bad request, a timeout, a cancellation)."""
        if overloaded is True:
            self.controller.overloaded(ticket)
        elif overloaded is False:
            self.controller.answered(ticket)
        hold = self.controller.recent_s if overloaded is True else None
        if hold:  # a 429 comes back at once: its slot stays taken for a round trip, as an answered call's would
            with contextlib.suppress(RuntimeError):  # (no running loop: freed now)
                asyncio.get_running_loop().call_later(hold, self._free)
                return
        self._free()

    def _free(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        """The first waiter goes when there is room (it wakes the next one when it has taken its slot)."""
        for waiter in self._waiters:
            if not waiter.done():
                if self.in_flight < self.allowed():
                    waiter.set_result(None)
                return


@dataclass
class AdaptiveConcurrency:
    """The run's adaptive limits, one per provider and model, made as the providers open; what the progress line
    shows."""

    settings: AdaptiveSettings
    clock: Callable[[], float] = time.monotonic
    flights: dict[str, AdaptiveFlight] = field(default_factory=dict)

    def flight(self, provider: str, model: str) -> AdaptiveFlight:
        key = f"{provider}/{model}"
        if key not in self.flights:
            initial = LimitState(min(self.settings.start, float(self.settings.ceiling)))
            store: LimitStore = MemoryLimit(initial)
            if self.settings.shared_value is not None:
                value = self.settings.shared_value(f"adaptive:{provider}/{model}")
                store = SharedLimitValue(value, initial, clock=self.clock)
            elif self.settings.shared_dir is not None:
                store = SharedLimitFile(self.settings.shared_dir / limit_file_name(provider, model), initial)
            workers = max(1, self.settings.workers)
            controller = AimdController(self.settings.ceiling, store, clock=self.clock, workers=workers)
            self.flights[key] = AdaptiveFlight(controller, workers=workers)
        return self.flights[key]

    def limits(self) -> dict[str, int]:
        """Provider/model -> the run's current limit of calls in flight (read from the shared files when this
        process opened no provider: the parent of workers)."""
        if self.flights:
            return {key: int(f.controller.limit) for key, f in self.flights.items()}
        found: dict[str, int] = {}
        folder = self.settings.shared_dir
        for path in sorted(folder.glob(f"*{LIMIT_SUFFIX}")) if folder is not None and folder.is_dir() else ():
            with contextlib.suppress(OSError, ValueError):
                found[path.name.removesuffix(LIMIT_SUFFIX)] = int(float(path.read_text(encoding="ascii").split()[0]))
        return found

    def describe(self) -> str:
        """``calls in flight ≤ 12 (auto)``, one figure per provider and model when there are several."""
        limits = self.limits()
        if not limits:
            return f"auto up to {self.settings.ceiling}"
        if len(limits) == 1:
            return f"auto {next(iter(limits.values()))}/{self.settings.ceiling}"
        return "auto " + ", ".join(f"{k} {v}" for k, v in limits.items()) + f" (ceiling {self.settings.ceiling})"


LIMIT_SUFFIX = ".concurrency"


def limit_file_name(provider: str, model: str) -> str:
    name = f"{provider}__{model}"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) + LIMIT_SUFFIX
