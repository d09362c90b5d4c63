"""Rate limiting: 200 tasks under ``provider.rate_limit.requests_per_minute`` chosen so the run must take about
30 s, against an emulator that enforces the same rate (and answers 429 above it).

    python -m benchmarks.ratelimit [--tasks 200] [--seconds 30]
    python -m benchmarks --only ratelimit

Each task is one model call through the real provider stack (``open_provider``: limiter, key pool, breaker,
retries, the ledger) and the official OpenAI SDK over loopback HTTP, against a 100 ms model. Figures: wall
time, the sustained rate after the first burst (what the limit governs) against the limit, the overall rate,
429s the server sent, and the time the ledger says tasks waited for the limiter.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/ratelimit.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Section, Sizes, Target, md_table
from flowllm.config.provider_schema import BreakerConfig, ProviderConfig, RateLimitConfig, RetryConfig
from flowllm.core.interfaces import CallContext
from flowllm.emulator import Emulator
from flowllm.emulator.faults import FaultPlan
from flowllm.providers import open_provider
from flowllm.providers.ledger import UsageLedger
from flowllm.providers.limiter import REQUEST_BURST_S

SCRIPT = {"default": [{"text": "The answer is \\boxed{42}"}]}
LATENCY_S = 0.1
JITTER_SLACK = 2  # requests the server lets through beyond the client's burst (loopback timing noise)
TOLERANCE = 0.05  # the target: the achieved rate within 5% of the limit


@dataclass
class RateFigures:
    tasks: int
    rpm: float
    burst: int
    wall_s: float
    sustained_per_s: float
    overall_per_s: float
    throttled: int
    failed: int
    limiter_wait_s: float

    @property
    def limit_per_s(self) -> float:
        return self.rpm / 60.0

    @property
    def deviation(self) -> float:
        return self.sustained_per_s / self.limit_per_s - 1.0


def rpm_for(tasks: int, seconds: float) -> float:
    """The requests per minute at which ``tasks`` requests take ``seconds``: the first burst (one second's
    worth) goes at once, the rest at the rate, so tasks = rate * (seconds + REQUEST_BURST_S)."""
    return round(60.0 * tasks / (seconds + REQUEST_BURST_S), 1)


async def _measure(tasks: int, rpm: float) -> RateFigures:
    burst = max(1, int(rpm / 60.0 * REQUEST_BURST_S))
    faults = FaultPlan.parse(
        {
            "rules": [{"fault": "delay", "delay_s": LATENCY_S}],
            "rate_limit": {"requests_per_minute": rpm, "burst": burst + JITTER_SLACK},
        }
    )
    with Emulator(SCRIPT, faults=faults) as emu:
        cfg = ProviderConfig(
            name="bench",
            protocol="openai_chat",
            model="flowllm-emulator",
            base_url=emu.openai_base_url,
            timeout_s=60.0,
            rate_limit=RateLimitConfig(requests_per_minute=rpm),
            retry=RetryConfig(max_attempts=1),  # a 429 fails its task: the count below hides nothing
            breaker=BreakerConfig(enabled=False),
        )
        ledger = UsageLedger(None)
        system = [{"type": "text", "text": "Be brief."}]
        messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        async with open_provider(cfg, ledger=ledger) as provider:

            async def one(i: int) -> bool:
                request = provider.build_request(system=system, messages=messages, tools=[])
                try:
                    await provider.send(request, context=CallContext(f"t{i:04d}", 1, "main"))
                except Exception:
                    return False
                return True

            started = time.perf_counter()
            results = await asyncio.gather(*(one(i) for i in range(tasks)))
            wall = time.perf_counter() - started
        throttle = emu.throttle
        throttled = throttle.throttled if throttle is not None else 0
    sent = sorted(a["ts"] for a in ledger.attempts())
    after_burst = sent[burst - 1 :]
    span = after_burst[-1] - after_burst[0] if len(after_burst) > 1 else 0.0
    return RateFigures(
        tasks=tasks,
        rpm=rpm,
        burst=burst,
        wall_s=wall,
        sustained_per_s=(len(after_burst) - 1) / span if span > 0 else float("nan"),
        overall_per_s=tasks / wall,
        throttled=throttled,
        failed=sum(1 for ok in results if not ok),
        limiter_wait_s=sum(float(a.get("limiter_wait_s") or 0.0) for a in ledger.attempts()),
    )


def measure(tasks: int = 200, seconds: float = 30.0) -> RateFigures:
    return asyncio.run(_measure(tasks, rpm_for(tasks, seconds)))


def section(fig: RateFigures) -> Section:
    table = md_table(
        [
            "tasks",
            "limit (rpm)",
            "limit (req/s)",
            "sustained (req/s)",
            "overall (req/s)",
            "wall (s)",
            "429s",
            "failed",
            "limiter wait (task-s)",
        ],
        [
            [
                fig.tasks,
                f"{fig.rpm:g}",
                f"{fig.limit_per_s:.3f}",
                f"{fig.sustained_per_s:.3f}",
                f"{fig.overall_per_s:.3f}",
                f"{fig.wall_s:.1f}",
                fig.throttled,
                fig.failed,
                f"{fig.limiter_wait_s:.0f}",
            ]
        ],
    )
    intro = (
        f"`python -m benchmarks.ratelimit`: {fig.tasks} one-call tasks started at once under "
        f"`provider.rate_limit.requests_per_minute={fig.rpm:g}` (a burst of {fig.burst}, then the rate), "
        f"against the emulator's {LATENCY_S * 1000:.0f} ms model enforcing the same rate (a burst of "
        f"{fig.burst + JITTER_SLACK}: {JITTER_SLACK} requests of slack for loopback timing noise). Sustained = "
        "requests after the first burst divided by the time they took, by the ledger's send times."
    )
    targets = [
        Target(
            "achieved rate vs the limit",
            f"within {TOLERANCE:.0%}",
            f"{fig.deviation:+.1%}",
            abs(fig.deviation) <= TOLERANCE,
        ),
        Target("429s from a server enforcing the same limit", "0", str(fig.throttled), fig.throttled == 0),
    ]
    return Section("Rate limiting", intro, [table], [], targets, data=fig.__dict__.copy())


def run(sizes: Sizes) -> Section:
    quick = sizes == Sizes.quick()
    return section(measure(20, 2.0) if quick else measure(200, 30.0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ratelimit", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the limit makes the run take")
    args = parser.parse_args(argv)
    print(section(measure(args.tasks, args.seconds)).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
