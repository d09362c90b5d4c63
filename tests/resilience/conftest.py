"""Shared helpers: a fake clock the breaker, key pool and retry waits all read, and provider configs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowllm.config.provider_schema import BreakerConfig, KeyPoolConfig, ProviderConfig, RetryConfig


class FakeTime:
    """Time that only moves when something sleeps: waits are instant and their lengths are recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


def provider_cfg(name: str = "offline", protocol: str = "anthropic", **overrides: Any) -> ProviderConfig:
    """An emulator-backed provider config with fast retry settings (waits are fake anyway)."""
    cfg = ProviderConfig(
        name=name,
        protocol=protocol,
        model="flowllm-emulator",
        timeout_s=5.0,
        retry=RetryConfig(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05, max_retry_after_s=1.0),
        breaker=BreakerConfig(failure_threshold=3, recovery_timeout_s=10.0),
        key_pool=KeyPoolConfig(cooldown_s=5.0, max_wait_s=30.0),
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg
