"""The retry policy: which failed attempts are tried again, and how long to wait first.

One policy for every SDK (both are built with ``max_retries=0``), driven by tenacity (``RetryPolicy.run``, called
by ``resilient.py`` for each provider of a call). The decisions are small pure functions so they can be tested one
by one:

* ``retryable(error)``: the kind is in ``retry.retry_on`` and never one of ``NEVER_RETRY_KINDS`` (400, 401,
  403, 404, quota, a prompt longer than the context window): those fail the same way every time.
* ``wait_s(attempt, error)``: the server's ``retry-after`` / ``retry-after-ms`` when it sent one (capped by
  ``max_retry_after_s``), else exponential backoff with jitter, capped by ``max_delay_s``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, stop_after_delay

from flowllm.config.provider_schema import RetryConfig
from flowllm.providers.errors import ALL_KINDS, NEVER_RETRY_KINDS, ProviderCallError, ProviderConfigError

T = TypeVar("T")


@dataclass
class RetryPolicy:
    max_attempts: int
    base_delay_s: float
    max_delay_s: float
    max_retry_after_s: float
    max_total_s: float
    retry_on: frozenset[str]
    check_reply: bool = True
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    @classmethod
    def from_config(cls, cfg: RetryConfig, *, provider: str = "") -> RetryPolicy:
        """The policy of ``provider.retry``; a setting that cannot work is a ``ProviderConfigError``."""
        where = f"provider '{provider}': retry" if provider else "provider.retry"
        if cfg.max_attempts < 1:
            raise ProviderConfigError(f"{where}.max_attempts must be at least 1 (1 = no retry), not {cfg.max_attempts}")
        for name in ("base_delay_s", "max_delay_s", "max_retry_after_s", "max_total_s"):
            if getattr(cfg, name) < 0:
                raise ProviderConfigError(f"{where}.{name} cannot be negative ({getattr(cfg, name)})")
        kinds = frozenset(str(k) for k in cfg.retry_on)
        unknown = sorted(kinds - ALL_KINDS)
        if unknown:
            raise ProviderConfigError(
                f"{where}.retry_on: unknown error kind(s) {', '.join(unknown)} (known: {', '.join(sorted(ALL_KINDS))})"
            )
        refused = sorted(kinds & NEVER_RETRY_KINDS)
        if refused:
            raise ProviderConfigError(
                f"{where}.retry_on: {', '.join(refused)} can never be retried (the same request fails the same way)"
            )
        return cls(
            max_attempts=cfg.max_attempts,
            base_delay_s=cfg.base_delay_s,
            max_delay_s=cfg.max_delay_s,
            max_retry_after_s=cfg.max_retry_after_s,
            max_total_s=cfg.max_total_s,
            retry_on=kinds,
            check_reply=cfg.check_reply,
        )

    def retryable(self, error: BaseException) -> bool:
        return (
            isinstance(error, ProviderCallError) and error.kind not in NEVER_RETRY_KINDS and error.kind in self.retry_on
        )

    def backoff_s(self, attempt: int) -> float:
        """Exponential backoff with "equal jitter": half of base x 2^(attempt-1) for sure, the other half
        random, so concurrent tasks that failed together do not come back together, yet never retry at once."""
        ceiling = min(self.max_delay_s, self.base_delay_s * (2 ** max(attempt - 1, 0)))
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)

    def wait_s(self, attempt: int, error: BaseException | None) -> float:
        """How long to wait after failed attempt number ``attempt`` (1-based)."""
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None and retry_after >= 0:
            return min(float(retry_after), self.max_retry_after_s)
        return self.backoff_s(attempt)

    async def run(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        attempts: int,
        retry_if: Callable[[BaseException], bool],
        wait: Callable[[RetryCallState], float],
        sleep: Callable[[float], Awaitable[Any]],
    ) -> T:
        """``attempt()`` until it returns, at most ``attempts`` times and within ``max_total_s``: a failure is
        tried again when ``retry_if(error)``, after ``wait``; the last failure is raised as it is.

        The first attempt runs here, without tenacity (see the module doc); a failure that is retried hands over
        to tenacity with that failure as its first attempt's outcome and the time it took off ``max_total_s``.
        """
        started = time.monotonic()
        try:
            return await attempt()
        except Exception as error:  # CancelledError and the like are never retried: they propagate untouched
            if attempts <= 1 or not retry_if(error):
                raise
            failed: list[Exception] = [error]

        async def attempts_after_the_first() -> T:
            if failed:
                raise failed.pop()  # tenacity's first attempt: the failure already met
            return await attempt()

        left_s = max(self.max_total_s - (time.monotonic() - started), 0.0)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts) | stop_after_delay(left_s),
            wait=wait,
            retry=retry_if_exception(retry_if),
            sleep=sleep,
            reraise=True,
        )
        result: T = await retrying(attempts_after_the_first)
        return result
