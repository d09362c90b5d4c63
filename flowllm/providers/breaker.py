"""A circuit breaker per provider: stop sending to a provider that is down, try it again later.

    closed ──(failure_threshold consecutive failed attempts)──► open
    open ──(recovery_timeout_s elapsed, next call)──► half_open: exactly one trial attempt goes through
    half_open ──trial succeeds──► closed        half_open ──trial fails──► open (the timeout starts again)

Concurrent tasks: ``admit()`` answers at once (a ``Permit``, or None when the breaker refuses), and a refused
caller that wants to wait sleeps in ``wait_admittable()``: until the recovery timeout when open, until the
trial reports when half-open (an ``asyncio.Event``, never a poll). The trial's permit is handed back on every
path: ``record_success`` / ``record_failure`` when it got an answer, ``release`` otherwise (cancelled, no
usable key, a bug), so a half-open breaker never keeps a trial "in flight" that nobody runs.

Only failures that say something about the provider's health count (timeouts, connection errors, 5xx, 429,
overload, broken replies); a 400 or a bad key means the server is up, so it counts as a success here.
The clock is injectable so the state machine is tested without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from flowllm.config.provider_schema import BreakerConfig
from flowllm.errors import DEFAULT_RETRY_ON
from flowllm.providers.errors import ProviderCallError, ProviderConfigError

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

# Failure kinds that mean "this provider is unwell right now": those a retry policy retries by default.
HEALTH_KINDS = frozenset(DEFAULT_RETRY_ON)


@dataclass(frozen=True)
class Transition:
    provider: str
    old: str
    new: str
    reason: str
    at: float  # wall-clock seconds (time.time), for the ledger and the summary

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "from": self.old, "to": self.new, "reason": self.reason, "at": self.at}


@dataclass(frozen=True)
class Permit:
    """Leave to send one attempt; ``trial`` is True for the one attempt a half-open breaker lets through
    (``generation`` tells a trial from an earlier one that reports late)."""

    trial: bool = False
    generation: int = 0


PLAIN_PERMIT = Permit(trial=False)


def check_breaker_config(cfg: BreakerConfig, *, provider: str = "") -> None:
    where = f"provider '{provider}': breaker" if provider else "provider.breaker"
    if cfg.failure_threshold < 1:
        raise ProviderConfigError(f"{where}.failure_threshold must be at least 1, not {cfg.failure_threshold}")
    if cfg.recovery_timeout_s < 0:
        raise ProviderConfigError(f"{where}.recovery_timeout_s cannot be negative ({cfg.recovery_timeout_s})")


class CircuitBreaker:
    def __init__(
        self,
        provider: str,
        cfg: BreakerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        on_transition: Callable[[Transition], None] | None = None,
    ) -> None:
        check_breaker_config(cfg, provider=provider)
        self.provider = provider
        self.enabled = cfg.enabled
        self.failure_threshold = cfg.failure_threshold
        self.recovery_timeout_s = cfg.recovery_timeout_s
        self.clock = clock
        self.sleep = sleep
        self.on_transition = on_transition
        self.state = CLOSED
        self.consecutive_failures = 0
        self.opened_at = 0.0
        self.trial_in_flight = False
        self._generation = 0  # of the current trial
        self.transitions: list[Transition] = []
        # Set (and replaced) whenever the trial ends, whichever way: what half-open waiters sleep on.
        self._trial_over = asyncio.Event()

    def _move(self, new: str, reason: str) -> None:
        transition = Transition(self.provider, self.state, new, reason, time.time())
        self.state = new
        if new != HALF_OPEN and self.trial_in_flight:
            self._end_trial()  # whatever the trial still says, it no longer decides anything
        self.transitions.append(transition)
        if self.on_transition is not None:
            self.on_transition(transition)

    def _end_trial(self) -> None:
        self.trial_in_flight = False
        self._trial_over.set()
        self._trial_over = asyncio.Event()

    def retry_at(self) -> float:
        """When an open breaker lets its trial through (clock time); now if it is not open."""
        return self.opened_at + self.recovery_timeout_s if self.state == OPEN else self.clock()

    def admit(self) -> Permit | None:
        """May an attempt go to this provider now? None: no (open, or half-open with the trial out). In
        half-open the permit is the trial's, given to one attempt at a time."""
        if not self.enabled or self.state == CLOSED:
            return PLAIN_PERMIT
        if self.state == OPEN:
            if self.clock() - self.opened_at < self.recovery_timeout_s:
                return None
            self._move(HALF_OPEN, f"recovery timeout of {self.recovery_timeout_s:g}s elapsed: one trial call")
        elif self.trial_in_flight:  # half-open: another call is the trial
            return None
        self.trial_in_flight = True
        self._generation += 1
        return Permit(trial=True, generation=self._generation)

    def _is_trial(self, permit: Permit | None) -> bool:
        """Does this outcome decide the half-open state? A caller without a permit (older code, tests)
        reporting in half-open is taken to be the trial."""
        if self.state != HALF_OPEN:
            return False
        if permit is None:
            return True
        return permit.trial and permit.generation == self._generation and self.trial_in_flight

    def allow(self) -> bool:
        """``admit()`` as a yes/no (the permit, if any, must still be reported or released)."""
        return self.admit() is not None

    async def wait_admittable(self, timeout_s: float) -> bool:
        """Sleep until ``admit()`` may say yes: the recovery timeout when open, the trial's end when
        half-open. False (at once) when that is more than ``timeout_s`` away (or the trial outlasts it)."""
        if not self.enabled or self.state == CLOSED:
            return True
        if self.state == OPEN:
            delay = self.retry_at() - self.clock()
            if delay > timeout_s:
                return False
            await self.sleep(max(delay, 0.0))
            return True
        if not self.trial_in_flight:
            return True
        try:
            await asyncio.wait_for(self._trial_over.wait(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            return False
        return True

    @property
    def closed(self) -> bool:
        return not self.enabled or self.state == CLOSED

    def record_success(self, permit: Permit | None = None) -> None:
        self.consecutive_failures = 0
        if self.enabled and self.state == HALF_OPEN:
            # The trial, or an attempt sent before the breaker opened that came back well: either way, up.
            self._move(CLOSED, "trial call succeeded" if self._is_trial(permit) else "a call succeeded")

    def record_failure(self, error: ProviderCallError, permit: Permit | None = None) -> None:
        if error.kind not in HEALTH_KINDS:
            # The server answered (a 400, a bad key): it is up, whatever is wrong with this request.
            self.record_success(permit)
            return
        self.consecutive_failures += 1
        if not self.enabled:
            return
        if self._is_trial(permit):
            self.opened_at = self.clock()
            self._move(OPEN, f"trial call failed ({error.kind})")
        elif self.state == CLOSED and self.consecutive_failures >= self.failure_threshold:
            self.opened_at = self.clock()
            self._move(OPEN, f"{self.consecutive_failures} consecutive failed attempts (last: {error.kind})")
        # Otherwise an attempt sent before the breaker opened failed while it is open or half-open: it only
        # counts, it says nothing about the trial.

    def release(self, permit: Permit | None) -> None:
        """The attempt ended without an answer either way (cancelled, no usable key, a bug): a half-open
        trial may be given again, and whoever waits for it wakes up."""
        if permit is not None and self._is_trial(permit):
            self._end_trial()

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "consecutive_failures": self.consecutive_failures,
            "transitions": [t.to_dict() for t in self.transitions],
        }
