"""Client-side rate limits per provider: ``provider.rate_limit: {requests_per_minute, tokens_per_minute,
max_in_flight}``, shared by every task that sends to the provider, so a run stays inside its quota instead of
learning it from 429s.

    slot = await limiter.enter(tokens, retry=r)    # waits: a 429's pause, an in-flight slot (a retry goes first
    ...send...                                      # in line for an adaptive one), request and token budgets;
                                                    # slot.waited_s goes to the ledger
    limiter.leave(slot, used_tokens)                # frees the in-flight slot; tokens beyond the estimate are
                                                    # charged to the next caller
    limiter.back_off(retry_after_s)                 # a 429: every task waits it out, not only the one that got it
                                                    # (and the tasks it held leave one per retry-after)

Requests and tokens per minute are leaky buckets (``aiolimiter``) that refill continuously: requests with a
burst of one second's worth (at least one request), tokens with a burst of ten seconds' worth, so a run's
rate holds close to the limit from its first second instead of spending a minute's quota in the first burst.
``max_in_flight`` is a semaphore (a llama.cpp server with one slot wants 1).

Under ``experiment.workers=N`` (local or Ray) each worker has its own ``LocalLimiter`` with 1/N of the rates, so
the run as a whole holds the limit; a 429's pause reaches the other workers through a small file per provider
in the run directory (``$FLOWLLM_SHARED_PAUSES``, set by the parent for its workers): ``SharedPause`` writes the
wall-clock time until which nobody sends, and every limiter reads it again whenever the file changes.

Where that shared state lives is a ``SharedLimits``: ``FileLimits`` (the above: buckets of this process, pauses in
files) or, with ``experiment.coordination=redis://...``, ``flowllm.core.coordination.RedisLimits`` (the run's one
bucket per provider and kind, and its pauses, in Redis: processes on several machines hold the limit together).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiolimiter import AsyncLimiter

from flowllm.config.provider_schema import RateLimitConfig
from flowllm.providers.adaptive.aimd import AdaptiveFlight, Ticket
from flowllm.providers.errors import ProviderConfigError

SHARED_PAUSES_ENV = "FLOWLLM_SHARED_PAUSES"  # a folder every worker of the run sees (in the run directory)
REQUEST_BURST_S = 1.0  # the request bucket holds one second's worth of requests (at least one)
TOKEN_BURST_S = 10.0  # the token bucket holds ten seconds' worth of tokens


def check_rate_limit_config(cfg: RateLimitConfig, *, provider: str = "") -> None:
    """``ProviderConfigError`` (one line) for a limit that cannot work: zero, negative, not a number."""
    where = f"provider '{provider}': rate_limit" if provider else "provider.rate_limit"
    for name in ("requests_per_minute", "tokens_per_minute", "max_in_flight"):
        value = getattr(cfg, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProviderConfigError(f"{where}.{name} must be a number (or null for no limit), not {value!r}")
        if value <= 0:
            raise ProviderConfigError(f"{where}.{name} must be above 0 (or null for no limit), not {value:g}")
    if cfg.max_in_flight is not None and int(cfg.max_in_flight) != cfg.max_in_flight:
        raise ProviderConfigError(f"{where}.max_in_flight must be a whole number, not {cfg.max_in_flight:g}")


def is_limited(cfg: RateLimitConfig) -> bool:
    return any(v is not None for v in (cfg.requests_per_minute, cfg.tokens_per_minute, cfg.max_in_flight))


@dataclass
class Slot:
    """One admitted request: how long it waited for the limiter, what it was charged."""

    waited_s: float = 0.0
    tokens: int = 0
    holds_flight: bool = False
    adaptive: Ticket | None = None  # admitted by the adaptive limit (experiment.max_concurrent=auto)
    # What the answer said of the provider's load, set by the caller before ``leave``: True for a 429 or an
    # overload error, False for an answer, None for nothing (a bad request, a timeout, a cancellation).
    overloaded: bool | None = None


class Limiter(Protocol):
    """What the resilient provider needs of a rate limiter (one per provider, shared by its tasks)."""

    counts_tokens: bool  # does enter() want a token estimate (worth computing)?

    async def enter(self, estimated_tokens: int = 0, *, retry: bool = False) -> Slot: ...

    def leave(self, slot: Slot, used_tokens: int | None = None) -> None: ...

    def back_off(self, seconds: float) -> None: ...


class Unlimited:
    """No limit configured: nothing waits (a 429 is then handled by the retry policy and the key pool)."""

    counts_tokens = False

    async def enter(self, estimated_tokens: int = 0, *, retry: bool = False) -> Slot:
        return Slot()

    def leave(self, slot: Slot, used_tokens: int | None = None) -> None:
        return None

    def back_off(self, seconds: float) -> None:
        return None


class Bucket(Protocol):
    """A rate's bucket: ``acquire(amount)`` waits until ``amount`` fits (``aiolimiter.AsyncLimiter`` is one)."""

    max_rate: float

    async def acquire(self, amount: float = 1) -> None: ...


class PauseStore(Protocol):
    """A 429's pause the processes of a run share: the seconds it has left, and lengthening it."""

    async def left(self) -> float: ...

    def extend(self, seconds: float) -> None: ...


class SharedLimits(Protocol):
    """Where the limiters of a run's processes keep what they share (``FileLimits`` or Redis)."""

    def bucket(self, provider: str, kind: str, max_rate: float, time_period: float) -> Bucket: ...

    def pause(self, provider: str) -> PauseStore | None: ...


class FileLimits:
    """One machine: each process its own buckets (the parent of N workers gives each 1/N of the rates), a 429's
    pause in a file per provider of ``folder`` (none: the pause stays this process's)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def bucket(self, provider: str, kind: str, max_rate: float, time_period: float) -> Bucket:
        return AsyncLimiter(max_rate, time_period)

    def pause(self, provider: str) -> PauseStore | None:
        return SharedPause(self.folder / f"{_file_name(provider)}.pause") if self.folder is not None else None


class SharedPause:
    """A 429's pause shared by the processes of one run: the wall-clock time until which nobody sends to one
    provider, in one small file (written by rename, so a reader sees the old value or the new, never half)."""

    def __init__(self, path: Path, wall: Callable[[], float] = time.time) -> None:
        self.path = path
        self.wall = wall
        self._seen: tuple[int, int, int] | None = None
        self._until = 0.0

    def until(self) -> float:
        """The shared pause's end (wall clock), read again only when the file changed."""
        try:
            info = self.path.stat()
        except OSError:
            return self._until
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if stamp != self._seen:
            with contextlib.suppress(OSError, ValueError):  # a file being replaced: the next look reads it
                self._until = float(self.path.read_text(encoding="ascii").strip() or 0.0)
                self._seen = stamp
        return self._until

    async def left(self) -> float:
        return self.until() - self.wall()

    def extend(self, seconds: float) -> None:
        until = self.wall() + seconds
        if until <= self.until():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{until:.3f}", encoding="ascii")
        os.replace(tmp, self.path)
        self._until = until


class LocalLimiter:
    """The limits of one provider, shared by every task of this process."""

    def __init__(
        self,
        cfg: RateLimitConfig,
        *,
        provider: str = "",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        shared: PauseStore | None = None,
        limits: SharedLimits | None = None,
        adaptive: AdaptiveFlight | None = None,
    ) -> None:
        check_rate_limit_config(cfg, provider=provider)
        self.provider = provider
        self.adaptive = adaptive  # experiment.max_concurrent=auto: calls in flight found by AIMD
        self.clock = clock
        self.sleep = sleep
        limits = limits or FileLimits(None)
        self.shared = shared  # the other workers' 429 pauses, and where ours go
        self.requests: Bucket | None = None
        self.tokens: Bucket | None = None
        self.flight: asyncio.Semaphore | None = None
        if cfg.requests_per_minute is not None:
            per_s = float(cfg.requests_per_minute) / 60.0
            burst = max(1.0, per_s * REQUEST_BURST_S)
            self.requests = limits.bucket(provider, "requests", burst, burst / per_s)
        if cfg.tokens_per_minute is not None:
            per_s = float(cfg.tokens_per_minute) / 60.0
            burst = max(1.0, per_s * TOKEN_BURST_S)
            self.tokens = limits.bucket(provider, "tokens", burst, burst / per_s)
        if cfg.max_in_flight is not None:
            self.flight = asyncio.Semaphore(int(cfg.max_in_flight))
        self.counts_tokens = self.tokens is not None
        self.paused_until = 0.0  # clock time before which nobody sends (a 429's retry-after)
        self.spacing = 0.0  # the last 429's retry-after: the callers a pause held leave this far apart
        self.next_turn = 0.0  # clock time at which the next caller a pause held may leave
        self.debt = 0  # tokens used beyond the estimates, charged to the next callers

    async def _left(self) -> float:
        left = self.paused_until - self.clock()
        if self.shared is not None:
            left = max(left, await self.shared.left())
        return left

    async def _wait_pause(self) -> None:
        waited = False
        while (left := await self._left()) > 0:
            waited = True
            await self.sleep(left)  # a later 429 may push the pause further: look again
        if waited and self.spacing > 0:
            # A retry-after frees one request, not all the callers it held: they leave one per retry-after
            # (else they all go at once, all but one meet another 429, and a retry can run out of attempts).
            now = self.clock()
            turn = max(now, self.next_turn)
            self.next_turn = turn + self.spacing
            if turn > now:
                await self.sleep(turn - now)

    async def enter(self, estimated_tokens: int = 0, *, retry: bool = False) -> Slot:
        started = self.clock()
        slot = Slot()
        await self._wait_pause()
        if self.adaptive is not None:
            slot.adaptive = await self.adaptive.acquire(retry=retry)
        try:
            if self.flight is not None:
                await self.flight.acquire()
                slot.holds_flight = True
        except BaseException:
            self._free(slot)
            raise
        try:
            if self.requests is not None:
                await self.requests.acquire(1)
            if self.tokens is not None:
                charge = max(int(estimated_tokens), 0) + self.debt
                self.debt = 0
                # A request bigger than the bucket waits for a full bucket, then goes.
                await self.tokens.acquire(min(float(charge), self.tokens.max_rate))
                slot.tokens = max(int(estimated_tokens), 0)
            await self._wait_pause()  # a 429 met by someone else while this one waited
        except BaseException:
            self._free(slot)
            raise
        if slot.adaptive is not None and self.adaptive is not None:
            slot.adaptive.started = self.adaptive.controller.clock()  # its latency: from here, not the waits
        slot.waited_s = max(self.clock() - started, 0.0)
        return slot

    def _free(self, slot: Slot) -> None:
        if slot.holds_flight and self.flight is not None:
            slot.holds_flight = False
            self.flight.release()
        if slot.adaptive is not None and self.adaptive is not None:
            ticket, slot.adaptive = slot.adaptive, None
            self.adaptive.release(ticket, slot.overloaded)

    def leave(self, slot: Slot, used_tokens: int | None = None) -> None:
        self._free(slot)
        if self.tokens is not None and used_tokens is not None and used_tokens > slot.tokens:
            self.debt += used_tokens - slot.tokens

    def back_off(self, seconds: float) -> None:
        """A 429 (its retry-after, else the key pool's cooldown): nobody sends to this provider until then."""
        if seconds > 0:
            self.spacing = seconds
            self.paused_until = max(self.paused_until, self.clock() + seconds)
            if self.shared is not None:
                self.shared.extend(seconds)


def build_limiter(
    cfg: RateLimitConfig,
    *,
    provider: str = "",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    limits: SharedLimits | None = None,
    adaptive: AdaptiveFlight | None = None,
) -> Limiter:
    """The limiter of one provider for this process (``Unlimited`` when no limit is set and the calls in flight
    are not adaptive); ``limits``: where the run's processes share its state (default: this machine's files,
    ``FileLimits``)."""
    if not is_limited(cfg) and adaptive is None:
        check_rate_limit_config(cfg, provider=provider)
        return Unlimited()
    if limits is None:
        folder = os.environ.get(SHARED_PAUSES_ENV)
        limits = FileLimits(Path(folder) if folder else None)
    shared = limits.pause(provider)
    return LocalLimiter(
        cfg, provider=provider, clock=clock, sleep=sleep, shared=shared, limits=limits, adaptive=adaptive
    )


def _file_name(provider: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in provider) or "provider"
