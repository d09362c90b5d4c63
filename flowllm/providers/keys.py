"""Key pools: several API keys for one provider, used round robin.

``provider.api_key_env`` names one variable or several (``"KEY_A,KEY_B"``), and a variable may itself hold
several keys separated by commas. Each key is known by a *label* (``KEY_A``, or ``KEY_A[2]`` for the second key
in ``KEY_A``): warnings, the ledger and the summary name labels, never keys.

* round robin over the keys that are ready;
* a key that gets a 429 rests for the server's retry-after (capped), or ``key_pool.cooldown_s``, and is
  skipped until then; when every key rests, ``acquire`` waits for the first to wake, at most
  ``key_pool.max_wait_s`` (beyond that the provider counts as unavailable and the call falls back);
* a key that gets 401/403 (or is out of quota) is retired for the run, with a warning naming its label.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flowllm.config.provider_schema import KeyPoolConfig
from flowllm.providers.errors import ProviderCallError, ProviderConfigError

log = logging.getLogger(__name__)

# Failures that condemn the key, not the request or the server.
RETIRE_KINDS = frozenset({"auth", "permission", "quota"})


@dataclass
class KeySlot:
    label: str
    value: str = field(repr=False)
    ready_at: float = 0.0
    retired: bool = False
    retired_because: str | None = None
    calls: int = 0
    rate_limited: int = 0

    def stats(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "rate_limited": self.rate_limited,
            "retired": self.retired,
            "retired_because": self.retired_because,
        }


class NoUsableKeyError(ProviderCallError):
    """Every key of the pool is retired, or resting longer than ``key_pool.max_wait_s``: nothing was sent."""


def key_variables(api_key_env: str | None) -> list[str]:
    """The variable names of ``provider.api_key_env`` (one name, or a comma list)."""
    if not api_key_env:
        return []
    return [name.strip() for name in str(api_key_env).split(",") if name.strip()]


def load_keys(api_key_env: str | None, environ: Mapping[str, str] | None = None) -> tuple[list[KeySlot], list[str]]:
    """(one slot per usable key, the variables that are unset or empty)."""
    env = os.environ if environ is None else environ
    slots: list[KeySlot] = []
    missing: list[str] = []
    for name in key_variables(api_key_env):
        values = [v.strip() for v in env.get(name, "").split(",") if v.strip()]
        if not values:
            missing.append(name)
        for i, value in enumerate(values, start=1):
            slots.append(KeySlot(name if len(values) == 1 else f"{name}[{i}]", value))
    return slots, missing


def secret_values(api_key_env: str | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every key of the pool, one by one: what the recorder must mask (a variable holding ``k1,k2`` yields
    both ``k1`` and ``k2``, so neither leaks on its own)."""
    slots, _ = load_keys(api_key_env, environ)
    return [s.value for s in slots]


def check_key_pool(api_key_env: str | None, provider: str, environ: Mapping[str, str] | None = None) -> None:
    """Raise ``ProviderConfigError`` when no variable of the pool holds a key; warn about the unset ones."""
    slots, missing = load_keys(api_key_env, environ)
    if not slots:
        names = key_variables(api_key_env)
        listed = ", ".join(names)
        raise ProviderConfigError(
            f"provider '{provider}' needs an API key: the environment variable{'s' if len(names) > 1 else ''} "
            f"{listed} {'are' if len(names) > 1 else 'is'} not set (export {names[0]}=<your key>, or point "
            "provider.api_key_env at the variable that holds it)"
        )
    if missing:
        log.warning("provider '%s': key variable(s) %s not set; using the other keys", provider, ", ".join(missing))


def check_key_pool_config(cfg: KeyPoolConfig, *, provider: str = "") -> None:
    where = f"provider '{provider}': key_pool" if provider else "provider.key_pool"
    for name in ("cooldown_s", "max_wait_s"):
        if getattr(cfg, name) < 0:
            raise ProviderConfigError(f"{where}.{name} cannot be negative ({getattr(cfg, name)})")


class KeyPool:
    def __init__(
        self,
        slots: list[KeySlot],
        cfg: KeyPoolConfig,
        *,
        provider: str = "",
        max_retry_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        on_event: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        if not slots:
            raise ProviderConfigError(f"provider '{provider}': the key pool is empty")
        check_key_pool_config(cfg, provider=provider)
        self.slots = slots
        self.cfg = cfg
        self.provider = provider
        self.max_retry_after_s = max_retry_after_s
        self.clock = clock
        self.sleep = sleep
        self.on_event = on_event
        self._next = 0

    def live(self) -> list[KeySlot]:
        return [s for s in self.slots if not s.retired]

    def ready(self) -> list[KeySlot]:
        now = self.clock()
        return [s for s in self.slots if not s.retired and s.ready_at <= now]

    def _pick(self) -> KeySlot | None:
        now = self.clock()
        n = len(self.slots)
        for step in range(n):
            slot = self.slots[(self._next + step) % n]
            if not slot.retired and slot.ready_at <= now:
                self._next = (self._next + step + 1) % n
                return slot
        return None

    async def acquire(self) -> KeySlot:
        """The next ready key, round robin; waits for a resting key (at most ``max_wait_s``)."""
        while True:
            slot = self._pick()
            if slot is not None:
                slot.calls += 1
                return slot
            live = self.live()
            if not live:
                raise NoUsableKeyError(
                    f"every key is retired ({', '.join(f'{s.label}: {s.retired_because}' for s in self.slots)})",
                    kind="auth",
                    provider=self.provider,
                )
            wait = min(s.ready_at for s in live) - self.clock()
            if wait > self.cfg.max_wait_s:
                raise NoUsableKeyError(
                    f"every key is resting after a 429 for {wait:.1f}s more (key_pool.max_wait_s="
                    f"{self.cfg.max_wait_s:g})",
                    kind="rate_limit",
                    provider=self.provider,
                )
            await self.sleep(max(wait, 0.0))

    def report(self, slot: KeySlot, error: ProviderCallError | None) -> None:
        """What the attempt with ``slot`` came to: None for a success."""
        if error is None:
            return
        if error.kind == "rate_limit":
            slot.rate_limited += 1
            if error.retry_after is not None:
                rest = min(error.retry_after, self.max_retry_after_s)
            else:
                rest = self.cfg.cooldown_s
            slot.ready_at = self.clock() + rest
            self._event(slot, "cooldown", rest_s=round(rest, 3))
        elif error.kind in RETIRE_KINDS and not slot.retired:
            slot.retired = True
            slot.retired_because = error.kind
            left = len(self.live())
            log.warning(
                "provider '%s': the key in %s was refused (%s%s); it is retired for this run, %d key(s) left",
                self.provider,
                slot.label,
                error.kind,
                f", HTTP {error.status}" if error.status else "",
                left,
            )
            self._event(slot, "retired", reason=error.kind, keys_left=left)

    def _event(self, slot: KeySlot, event: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event({"type": "key", "provider": self.provider, "key": slot.label, "event": event, **fields})

    def stats(self) -> dict[str, Any]:
        return {s.label: s.stats() for s in self.slots}
