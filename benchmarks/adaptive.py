"""Adaptive concurrency: ``experiment.max_concurrent=auto`` against a provider limited to N requests per minute,
compared with the best static number of calls in flight found by a sweep.

    python -m benchmarks.adaptive [--calls 1800] [--rpm 1800] [--latency 0.5]
    python -m benchmarks --only adaptive

Each measurement sends ``calls`` model calls through the real provider stack (``open_provider``: limiter, key
pool, breaker, retries honouring Retry-After, the ledger) and the official OpenAI SDK over loopback HTTP, from 64
tasks at once, against the emulator's model that answers in ``latency`` seconds and enforces ``rpm`` requests
per minute (GCRA, a burst of one second's worth; above it a 429 with Retry-After). The provider can serve
rpm/60 * latency calls at once; more only buys 429s. Static: ``provider.rate_limit.max_in_flight=c`` for each c
of the sweep. Auto: the AIMD limit (flowllm/providers/adaptive/aimd.py), started far below (2) and far above (64,
the ceiling). Figures: calls answered per second over the whole run, and the share of requests answered 429.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/adaptive.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Section, Sizes, Target, md_table
from flowllm.config.provider_schema import BreakerConfig, ProviderConfig, RateLimitConfig, RetryConfig
from flowllm.core.interfaces import CallContext
from flowllm.emulator import Emulator
from flowllm.emulator.faults import FaultPlan
from flowllm.providers import open_provider
from flowllm.providers.adaptive.aimd import AdaptiveConcurrency, AdaptiveSettings
from flowllm.providers.ledger import UsageLedger

SCRIPT = {"default": [{"text": "The answer is \\boxed{42}"}]}
TASKS = 64  # callers at once (the ceiling of auto)
THROUGHPUT_TARGET = 0.90  # auto's throughput against the best static value
THROTTLE_TARGET = 0.02  # the share of requests answered 429


@dataclass
class Measured:
    label: str
    calls: int
    wall_s: float
    throttled: int
    admitted: int
    failed: int
    final_limit: int | None = None

    @property
    def per_s(self) -> float:
        return self.calls / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def throttled_share(self) -> float:
        sent = self.throttled + self.admitted
        return self.throttled / sent if sent else 0.0


async def _measure(label: str, calls: int, rpm: float, latency: float, static: int | None, start: float) -> Measured:
    faults = FaultPlan.parse(
        {
            "rules": [{"fault": "delay", "delay_s": latency}],
            "rate_limit": {"requests_per_minute": rpm, "burst": max(1, int(rpm / 60.0))},
        }
    )
    adaptive = None if static is not None else AdaptiveConcurrency(AdaptiveSettings(TASKS, start=start))
    with Emulator(SCRIPT, faults=faults) as emu:
        cfg = ProviderConfig(
            name="bench",
            protocol="openai_chat",
            model="flowllm-emulator",
            base_url=emu.openai_base_url,
            timeout_s=60.0,
            rate_limit=RateLimitConfig(max_in_flight=static),
            retry=RetryConfig(max_attempts=20, max_total_s=120.0),  # a 429 waits its Retry-After and goes again
            breaker=BreakerConfig(enabled=False),
        )
        system = [{"type": "text", "text": "Be brief."}]
        messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        left = list(range(calls))
        failed = 0
        async with open_provider(cfg, ledger=UsageLedger(None), adaptive=adaptive) as provider:

            async def caller() -> None:
                nonlocal failed
                while left:
                    i = left.pop()
                    request = provider.build_request(system=system, messages=messages, tools=[])
                    try:
                        await provider.send(request, context=CallContext(f"t{i:05d}", 1, "main"))
                    except Exception:
                        failed += 1

            started = time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(TASKS)))
            wall = time.perf_counter() - started
        throttle = emu.throttle
        assert throttle is not None
        limit = next(iter(adaptive.limits().values()), None) if adaptive is not None else None
        return Measured(label, calls - failed, wall, throttle.throttled, throttle.admitted, failed, limit)


def measure(
    label: str, calls: int, rpm: float, latency: float, static: int | None = None, start: float = 4
) -> Measured:
    return asyncio.run(_measure(label, calls, rpm, latency, static, start))


def sweep_values(capacity: float) -> list[int]:
    """Static values around the provider's capacity (rpm/60 * latency calls at once)."""
    return sorted({max(1, round(capacity * f)) for f in (0.5, 1.0, 1.5, 2.0)})


def section(rows: list[Measured], rpm: float, latency: float, calls: int) -> Section:
    static = [r for r in rows if r.final_limit is None]
    auto = [r for r in rows if r.final_limit is not None]
    best = max(static, key=lambda r: r.per_s)
    table = md_table(
        ["calls in flight", "calls/s", "of the best static", "429 share", "wall (s)", "failed", "auto's final limit"],
        [
            [
                r.label,
                f"{r.per_s:.2f}",
                f"{r.per_s / best.per_s:.0%}",
                f"{r.throttled_share:.2%}",
                f"{r.wall_s:.1f}",
                r.failed,
                "-" if r.final_limit is None else r.final_limit,
            ]
            for r in rows
        ],
    )
    intro = (
        f"`python -m benchmarks.adaptive`: {calls} one-call tasks from {TASKS} callers against the emulator's "
        f"{latency * 1000:.0f} ms model limited to {rpm:g} requests per minute (it serves "
        f"{rpm / 60 * latency:g} calls at once; a burst of one second's worth, then 429 with Retry-After). "
        "Static rows hold `provider.rate_limit.max_in_flight`; auto rows run `experiment.max_concurrent=auto` "
        "(AIMD) from a start far below and far above."
    )
    targets = [
        Target(
            f"auto ({r.label}) throughput vs the best static ({best.label})",
            f">= {THROUGHPUT_TARGET:.0%}",
            f"{r.per_s / best.per_s:.0%}",
            r.per_s >= THROUGHPUT_TARGET * best.per_s,
        )
        for r in auto
    ] + [
        Target(
            f"auto ({r.label}) 429 share",
            f"< {THROTTLE_TARGET:.0%}",
            f"{r.throttled_share:.2%}",
            r.throttled_share < THROTTLE_TARGET,
        )
        for r in auto
    ]
    data = {"rows": [r.__dict__ | {"per_s": r.per_s, "throttled_share": r.throttled_share} for r in rows]}
    return Section("Adaptive concurrency", intro, [table], [], targets, data=data)


def run_all(calls: int, rpm: float, latency: float) -> Section:
    capacity = rpm / 60.0 * latency
    rows = [measure(f"static {c}", calls, rpm, latency, static=c) for c in sweep_values(capacity)]
    rows.append(measure("auto from 2", calls, rpm, latency, start=2))
    rows.append(measure(f"auto from {TASKS}", calls, rpm, latency, start=TASKS))
    return section(rows, rpm, latency, calls)


def run(sizes: Sizes) -> Section:
    quick = sizes == Sizes.quick()
    return run_all(30, 6000.0, 0.05) if quick else run_all(1800, 1800.0, 0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adaptive", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1800)
    parser.add_argument("--rpm", type=float, default=1800.0)
    parser.add_argument("--latency", type=float, default=0.5, help="the model's seconds per answer")
    args = parser.parse_args(argv)
    print(run_all(args.calls, args.rpm, args.latency).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
