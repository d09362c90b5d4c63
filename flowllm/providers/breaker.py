"""A circuit breaker per provider: stop sending to a provider that is down, try it again later.

    closed ──(failure_threshold consecutive failed attempts)──► open
    open ──(recovery_timeout_s elapsed, next call)──► half_open: exactly one trial attempt goes through
    half_open ──trial succeeds──► closed        half_open ──trial fails──► open (the timeout starts again)

Only failures that say something about the provider's health count (timeouts, connection errors, 5xx, 429,
overload, broken replies); a 400 or a bad key means the server is up, so it counts as a success here.
The clock is injectable so the state machine is tested without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowllm.config.schema import BreakerConfig
from flowllm.providers.errors import ProviderCallError, ProviderConfigError

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

# Failure kinds that mean "this provider is unwell right now".
HEALTH_KINDS = frozenset(
    {
        "connection",
        "timeout",
        "rate_limit",
        "overloaded",
        "server",
        "conflict",
        "truncated",
        "stream_error",
        "bad_response",
        "empty_reply",
    }
)


@dataclass(frozen=True)
class Transition:
    provider: str
    old: str
    new: str
    reason: str
    at: float  # wall-clock seconds (time.time), for the ledger and the summary

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "from": self.old, "to": self.new, "reason": self.reason, "at": self.at}


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
        on_transition: Callable[[Transition], None] | None = None,
    ) -> None:
        check_breaker_config(cfg, provider=provider)
        self.provider = provider
        self.enabled = cfg.enabled
        self.failure_threshold = cfg.failure_threshold
        self.recovery_timeout_s = cfg.recovery_timeout_s
        self.clock = clock
        self.on_transition = on_transition
        self.state = CLOSED
        self.consecutive_failures = 0
        self.opened_at = 0.0
        self.trial_in_flight = False
        self.transitions: list[Transition] = []

    def _move(self, new: str, reason: str) -> None:
        transition = Transition(self.provider, self.state, new, reason, time.time())
        self.state = new
        self.transitions.append(transition)
        if self.on_transition is not None:
            self.on_transition(transition)

    def retry_at(self) -> float:
        """When an open breaker lets its trial through (clock time); now if it is not open."""
        return self.opened_at + self.recovery_timeout_s if self.state == OPEN else self.clock()

    def allow(self) -> bool:
        """May an attempt go to this provider now? In half-open, ``True`` is given to one trial at a time."""
        if not self.enabled or self.state == CLOSED:
            return True
        if self.state == OPEN:
            if self.clock() - self.opened_at < self.recovery_timeout_s:
                return False
            self._move(HALF_OPEN, f"recovery timeout of {self.recovery_timeout_s:g}s elapsed: one trial call")
            self.trial_in_flight = True
            return True
        if self.trial_in_flight:  # half-open: another call is the trial; route around until it reports
            return False
        self.trial_in_flight = True
        return True

    @property
    def closed(self) -> bool:
        return not self.enabled or self.state == CLOSED

    def record_success(self) -> None:
        self.consecutive_failures = 0
        if self.enabled and self.state == HALF_OPEN:
            self.trial_in_flight = False
            self._move(CLOSED, "trial call succeeded")

    def record_failure(self, error: ProviderCallError) -> None:
        if error.kind not in HEALTH_KINDS:
            # The server answered (a 400, a bad key): it is up, whatever is wrong with this request.
            self.record_success()
            return
        self.consecutive_failures += 1
        if not self.enabled:
            return
        if self.state == HALF_OPEN:
            self.trial_in_flight = False
            self.opened_at = self.clock()
            self._move(OPEN, f"trial call failed ({error.kind})")
        elif self.state == CLOSED and self.consecutive_failures >= self.failure_threshold:
            self.opened_at = self.clock()
            self._move(OPEN, f"{self.consecutive_failures} consecutive failed attempts (last: {error.kind})")

    def abandon(self) -> None:
        """The attempt ended without an answer either way (cancelled): a half-open trial may be given again."""
        if self.state == HALF_OPEN and self.trial_in_flight:
            self.trial_in_flight = False

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "consecutive_failures": self.consecutive_failures,
            "transitions": [t.to_dict() for t in self.transitions],
        }
