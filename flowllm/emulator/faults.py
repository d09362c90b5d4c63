"""Fault injection for the emulator: the failures a long run meets, on demand and reproducibly.

In the script file (or ``provider.emulator_faults``, merged over it)::

    faults:
      seed: 7
      rules:                                  # at most one fault per request; the first rule that fires wins
        - {fault: status, status: 429, retry_after_s: 0.05, rate: 0.05}
        - {fault: status, status: 529, rate: 0.05}
        - {fault: status, status: 400, code: context_length_exceeded, tasks: [t042]}   # a schedule
        - {fault: status, status: 401, api_keys: [the-bad-key]}                       # refuse one key
        - {fault: delay, delay_s: 2.0, rate: 0.02}            # answer late (longer than timeout_s: a timeout)
        - {fault: reset, rate: 0.02}                          # close the connection without an answer
        - {fault: truncate, rate: 0.02, after_events: 3}      # stream only: stop after 3 events, no error
        - {fault: stream_error, rate: 0.02, error_type: overloaded_error}   # stream only: an error event
        - {fault: malformed, rate: 0.02}                      # a JSON body (or SSE event) cut in half
        - {fault: empty, rate: 0.02}                          # a well-formed reply with no content

Each rule fires with probability ``rate`` (default 1.0), restricted by optional filters: ``tasks``,
``agents``, ``turns``, ``attempts`` (the n-th request the emulator sees for the same task, agent and turn:
retries count up), ``protocols``, ``api_keys``. Stream-only faults never fire on plain requests.

A server-side rate limit, like a provider's quota (``rate_limit:`` next to ``rules``)::

    faults:
      rate_limit: {requests_per_minute: 600, burst: 11}   # above it: 429 with retry-after (+ retry-after-ms)

``burst`` (default: one second's worth, at least 1) is how many requests may arrive at once; the rate refills
continuously (GCRA, the algorithm behind most API quotas), so a client leaky bucket at the same rate and a
burst at most one smaller is never refused (the one request of slack absorbs network jitter).

Deterministic: the draw is a hash of (seed, task, agent, turn, attempt), never a random generator, so a
rerun meets exactly the same faults, whatever the concurrency.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flowllm.core.registry import Registry

FAULTS: Registry[str] = Registry(
    "fault", {f: f for f in ("status", "delay", "reset", "truncate", "stream_error", "malformed", "empty")}
)
STREAM_ONLY = frozenset({"truncate", "stream_error"})
_RULE_KEYS = {
    "fault",
    "rate",
    "status",
    "error_type",
    "code",
    "message",
    "retry_after_s",
    "delay_s",
    "after_events",
    "tasks",
    "agents",
    "turns",
    "attempts",
    "protocols",
    "api_keys",
}

# The error type each status gets when the rule names none (Anthropic's names; the classifier reads them for
# every protocol).
STATUS_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",  # no such type exists: the status decides (conflict)
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "api_error",
    529: "overloaded_error",
}
CONTEXT_LENGTH_MESSAGE = "prompt is too long: 210000 tokens > 200000 maximum (context_length_exceeded)"


class FaultConfigError(ValueError):
    """The ``faults`` section is malformed; the message names the rule and the setting."""


@dataclass(frozen=True)
class FaultRule:
    fault: str
    rate: float = 1.0
    status: int = 500
    error_type: str | None = None
    code: str | None = None
    message: str | None = None
    retry_after_s: float | None = None
    delay_s: float = 0.0
    after_events: int | None = None
    tasks: frozenset[str] | None = None
    agents: frozenset[str] | None = None
    turns: frozenset[int] | None = None
    attempts: frozenset[int] | None = None
    protocols: frozenset[str] | None = None
    api_keys: frozenset[str] | None = None

    @property
    def filtered(self) -> bool:
        return any(
            f is not None for f in (self.tasks, self.agents, self.turns, self.attempts, self.protocols, self.api_keys)
        )

    def matches(self, draw: Draw) -> bool:
        if self.fault in STREAM_ONLY and not draw.stream:
            return False
        checks: list[tuple[Any, Any]] = [
            (self.tasks, draw.task_id),
            (self.agents, draw.agent),
            (self.turns, draw.turn),
            (self.attempts, draw.attempt),
            (self.protocols, draw.protocol),
            (self.api_keys, draw.api_key),
        ]
        return all(allowed is None or value in allowed for allowed, value in checks)

    def error_type_for(self) -> str:
        if self.error_type:
            return self.error_type
        return STATUS_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")

    def message_for(self) -> str:
        if self.message:
            return self.message
        if self.code == "context_length_exceeded":
            return CONTEXT_LENGTH_MESSAGE
        return f"injected fault: HTTP {self.status} ({self.error_type_for()})"

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        # Both forms, as OpenAI does: retry-after-ms for the precise value, retry-after in whole seconds.
        return {
            "retry-after-ms": str(math.ceil(round(self.retry_after_s * 1000, 6))),  # never early
            "retry-after": str(max(int(self.retry_after_s + 0.999), 0)),
        }


@dataclass(frozen=True)
class Draw:
    """What the decision depends on: one request's identity."""

    task_id: str | None
    agent: str | None
    turn: int
    attempt: int
    protocol: str
    stream: bool
    api_key: str | None = None

    def unit(self, seed: int) -> float:
        """A number in [0, 1) fixed by (seed, task, agent, turn, attempt)."""
        text = f"{seed}\x00{self.task_id}\x00{self.agent}\x00{self.turn}\x00{self.attempt}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


@dataclass(frozen=True)
class RateLimitSpec:
    requests_per_minute: float
    burst: float

    @classmethod
    def parse(cls, raw: Any, where: str) -> RateLimitSpec | None:
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise FaultConfigError(f"{where}: expected a mapping with requests_per_minute (and an optional burst)")
        unknown = set(raw) - {"requests_per_minute", "burst"}
        if unknown:
            raise FaultConfigError(f"{where}: unknown keys {sorted(unknown)} (allowed: burst, requests_per_minute)")
        try:
            rpm = float(raw["requests_per_minute"])
            burst = float(raw.get("burst") or max(1.0, rpm / 60.0))
        except (KeyError, TypeError, ValueError):
            raise FaultConfigError(f"{where}.requests_per_minute must be a number") from None
        if rpm <= 0 or burst < 1:
            raise FaultConfigError(f"{where}: requests_per_minute must be above 0 and burst at least 1")
        return cls(rpm, burst)


class RequestThrottle:
    """The server's side of ``rate_limit`` (GCRA): ``take()`` is 0 when a request may go, else the seconds
    until it could (the 429's retry-after). One per emulator; its handlers share one event loop."""

    def __init__(self, spec: RateLimitSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 60.0 / spec.requests_per_minute
        self.tolerance = (spec.burst - 1.0) * self.interval
        self.clock = clock
        self.theoretical_arrival = 0.0
        self.admitted = 0
        self.throttled = 0

    def take(self) -> float:
        now = self.clock()
        tat = max(self.theoretical_arrival, now)
        if tat - now > self.tolerance + 1e-9:
            self.throttled += 1
            return tat - now - self.tolerance
        self.theoretical_arrival = tat + self.interval
        self.admitted += 1
        return 0.0


@dataclass(frozen=True)
class FaultPlan:
    seed: int = 0
    rules: tuple[FaultRule, ...] = ()
    rate_limit: RateLimitSpec | None = None

    def pick(self, draw: Draw) -> FaultRule | None:
        if not self.rules:
            return None
        unit = draw.unit(self.seed)
        threshold = 0.0
        for rule in self.rules:
            if not rule.matches(draw):
                continue
            threshold += rule.rate
            if unit < threshold:
                return rule
        return None

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None, where: str = "faults") -> FaultPlan:
        if not data:
            return cls()
        if not isinstance(data, Mapping):
            raise FaultConfigError(f"{where}: expected a mapping with 'rules' (and an optional 'seed')")
        unknown = set(data) - {"seed", "rules", "rate_limit"}
        if unknown:
            raise FaultConfigError(f"{where}: unknown keys {sorted(unknown)} (allowed: rate_limit, rules, seed)")
        rules_raw = data.get("rules") or []
        if not isinstance(rules_raw, list):
            raise FaultConfigError(f"{where}.rules: expected a list of rules")
        rules = tuple(_rule(r, f"{where}.rules[{i}]") for i, r in enumerate(rules_raw, start=1))
        unfiltered = sum(r.rate for r in rules if not r.filtered)
        if unfiltered > 1.0 + 1e-9:
            raise FaultConfigError(f"{where}: the rates of the unfiltered rules add up to {unfiltered:g} (> 1)")
        try:
            seed = int(data.get("seed", 0))
        except (TypeError, ValueError):
            raise FaultConfigError(f"{where}.seed must be an integer") from None
        return cls(seed, rules, RateLimitSpec.parse(data.get("rate_limit"), f"{where}.rate_limit"))

    @classmethod
    def merge(cls, base: Mapping[str, Any] | None, override: Mapping[str, Any] | None) -> dict[str, Any]:
        """``override`` (provider.emulator_faults) over ``base`` (the script's section): seed replaced, rules
        replaced when given."""
        merged = dict(base or {})
        merged.update({k: v for k, v in dict(override or {}).items() if v is not None})
        return merged


def _set(value: Any, where: str, cast: type) -> frozenset[Any] | None:
    if value is None:
        return None
    items = value if isinstance(value, list | tuple) else [value]
    try:
        return frozenset(cast(v) for v in items)
    except (TypeError, ValueError):
        raise FaultConfigError(f"{where}: expected a list of {cast.__name__}") from None


def _rule(raw: Any, where: str) -> FaultRule:
    if not isinstance(raw, Mapping):
        raise FaultConfigError(f"{where}: a rule must be a mapping with 'fault'")
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise FaultConfigError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(_RULE_KEYS)})")
    fault = raw.get("fault")
    FAULTS.require(str(fault), FaultConfigError, key=f"{where}.fault")
    try:
        rate = float(raw.get("rate", 1.0))
        status = int(raw.get("status", 500))
        delay = float(raw.get("delay_s", 0.0))
        retry_after = None if raw.get("retry_after_s") is None else float(raw["retry_after_s"])
        after = None if raw.get("after_events") is None else int(raw["after_events"])
    except (TypeError, ValueError) as exc:
        raise FaultConfigError(f"{where}: {exc}") from None
    if not 0.0 <= rate <= 1.0:
        raise FaultConfigError(f"{where}.rate must be between 0 and 1, not {rate}")
    if fault == "status" and not 400 <= status <= 599:
        raise FaultConfigError(f"{where}.status must be an HTTP error status (400-599), not {status}")
    if delay < 0 or (retry_after is not None and retry_after < 0) or (after is not None and after < 0):
        raise FaultConfigError(f"{where}: delay_s, retry_after_s and after_events cannot be negative")
    if fault == "delay" and delay <= 0:
        raise FaultConfigError(f"{where}: a delay fault needs delay_s > 0")
    return FaultRule(
        fault=str(fault),
        rate=rate,
        status=status,
        error_type=None if raw.get("error_type") is None else str(raw["error_type"]),
        code=None if raw.get("code") is None else str(raw["code"]),
        message=None if raw.get("message") is None else str(raw["message"]),
        retry_after_s=retry_after,
        delay_s=delay,
        after_events=after,
        tasks=_set(raw.get("tasks"), f"{where}.tasks", str),
        agents=_set(raw.get("agents"), f"{where}.agents", str),
        turns=_set(raw.get("turns"), f"{where}.turns", int),
        attempts=_set(raw.get("attempts"), f"{where}.attempts", int),
        protocols=_set(raw.get("protocols"), f"{where}.protocols", str),
        api_keys=_set(raw.get("api_keys"), f"{where}.api_keys", str),
    )
