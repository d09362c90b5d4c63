"""Client-side rate limits (provider.rate_limit): through the real SDKs against an emulator that enforces
its own quota, plus the limiter's decisions on a fake clock and the start-up checks."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowllm.config.provider_schema import RateLimitConfig, RetryConfig
from flowllm.config.providers import FileResolver
from flowllm.core.interfaces import CallContext
from flowllm.emulator import Emulator
from flowllm.emulator.faults import FaultPlan, RateLimitSpec, RequestThrottle
from flowllm.providers import ProviderConfigError, check_provider_config, open_provider
from flowllm.providers.ledger import UsageLedger
from flowllm.providers.limiter import SHARED_PAUSES_ENV, LocalLimiter, SharedPause, Unlimited, build_limiter
from tests.appfork import run_app

from .conftest import FakeTime, provider_cfg

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = {"default": [{"text": "The answer is \\boxed{42}"}]}
SYSTEM = [{"type": "text", "text": "Be brief."}]
HELLO = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


async def ask(provider: Any, task: str) -> Any:
    request = provider.build_request(system=SYSTEM, messages=HELLO, tools=[])
    return provider.normalize(await provider.send(request, context=CallContext(task, 1, "main")))


# ----- the limit holds against a server that enforces the same one --------------------------------------------
async def test_tasks_under_the_servers_own_limit_provoke_no_429() -> None:
    # 1 request a second, 6 tasks at once: the client's burst is 1; the server enforces the same rate and lets
    # 3 arrive together (2 s of slack for the time between the limiter and the server, which a loaded machine
    # stretches). Without the client's limit 3 of the 6 would be refused.
    rpm, tasks = 60.0, 6
    faults = FaultPlan.parse({"rate_limit": {"requests_per_minute": rpm, "burst": 3}})
    with Emulator(SCRIPT, faults=faults) as emu:
        cfg = provider_cfg(protocol="openai_chat", base_url=emu.openai_base_url, timeout_s=60.0)
        cfg.rate_limit = RateLimitConfig(requests_per_minute=rpm)
        cfg.retry = RetryConfig(max_attempts=1)  # a 429 would fail its task: nothing hides one
        ledger = UsageLedger(None)
        async with open_provider(cfg, ledger=ledger) as provider:
            replies = await asyncio.wait_for(
                asyncio.gather(*(ask(provider, f"t{i}") for i in range(tasks))), timeout=120
            )
        throttle = emu.throttle
        assert throttle is not None
        assert throttle.throttled == 0 and throttle.admitted == tasks
    assert all(r.text.endswith("{42}") for r in replies)
    attempts = ledger.attempts()
    assert [a["outcome"] for a in attempts] == ["ok"] * tasks
    # The limiter spaced the sends by its own clock (a lower bound: load only makes them later).
    sent = sorted(a["ts"] for a in attempts)
    assert sent[-1] - sent[0] >= (tasks - 1) / (rpm / 60) - 0.05
    assert ledger.summary()["limiter_wait_s"] == pytest.approx(sum(a["limiter_wait_s"] for a in attempts), abs=1e-5)


async def test_without_the_client_limit_the_server_refuses_what_exceeds_its_quota() -> None:
    """The emulator side of the test above, on its own clock: GCRA with a burst, then one per interval."""
    t = FakeTime()
    throttle = RequestThrottle(RateLimitSpec(requests_per_minute=60, burst=2), clock=t.clock)
    assert [throttle.take() for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]
    t.now += 1.0
    assert throttle.take() == 0.0 and throttle.take() == pytest.approx(1.0)
    assert throttle.throttled == 2 and throttle.admitted == 3


# ----- max_in_flight -----------------------------------------------------------------------------------------
async def test_max_in_flight_one_sends_one_request_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump({**SCRIPT, "faults": {"rules": [{"fault": "delay", "delay_s": 0.1}]}}))
    cfg = provider_cfg(protocol="openai_chat", stream=True, emulator_script=str(path), timeout_s=60.0)
    cfg.rate_limit = RateLimitConfig(max_in_flight=1)
    ledger = UsageLedger(None)
    async with open_provider(cfg, ledger=ledger) as provider:
        await asyncio.wait_for(asyncio.gather(*(ask(provider, f"t{i}") for i in range(5))), timeout=120)
    spans = sorted((a["ts"], a["ts"] + a["latency_s"]) for a in ledger.attempts())
    assert len(spans) == 5
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.005  # never two requests at once (clock granularity aside)


def test_the_local_provider_defaults_to_one_request_at_a_time() -> None:
    local = FileResolver(ROOT / "flowllm" / "conf" / "provider")("local")
    assert local.rate_limit.max_in_flight == 1
    assert local.rate_limit.requests_per_minute is None and local.rate_limit.tokens_per_minute is None


# ----- a 429 pauses everyone ---------------------------------------------------------------------------------
class ManualTime:
    """A clock that moves only when the test says so; sleepers wake when it passes their deadline."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.now + seconds, future))
        await future

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        for deadline, future in self.sleepers:
            if deadline <= self.now and not future.done():
                future.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)


async def test_a_429_pauses_every_task_not_only_the_one_that_got_it() -> None:
    t = ManualTime()
    limiter = LocalLimiter(RateLimitConfig(max_in_flight=10), clock=t.clock, sleep=t.sleep)
    limiter.back_off(2.0)
    entering = [asyncio.ensure_future(limiter.enter()) for _ in range(3)]
    await t.advance(0.0)  # they start, and wait
    await t.advance(1.0)
    assert not any(e.done() for e in entering)  # all three wait, though none of them got the 429
    limiter.back_off(0.5)  # a shorter pause never shortens the one in force
    await t.advance(1.0)
    assert sum(e.done() for e in entering) == 1  # when it ends, the callers it held leave one per retry-after,
    await t.advance(0.5)  # the last 429's (0.5 s): all at once, all but one would meet another 429
    await t.advance(0.5)
    slots = await asyncio.gather(*entering)
    assert sorted(s.waited_s for s in slots) == [2.0, 2.5, 3.0]
    for slot in slots:
        limiter.leave(slot)
    assert (await limiter.enter()).waited_s == 0.0  # the pause is over


async def test_a_429_in_one_worker_pauses_the_other_workers_of_the_run(tmp_path: Path) -> None:
    # Two workers' limiters of one provider, each with its own clock as two processes would have, sharing the
    # run's pause file; the wall clock both read is the same one.
    t = ManualTime()
    folder = tmp_path / ".rate_limit_pauses"
    first, second = (
        LocalLimiter(
            RateLimitConfig(max_in_flight=4),
            clock=t.clock,
            sleep=t.sleep,
            shared=SharedPause(folder / "claude.pause", wall=t.clock),
        )
        for _ in range(2)
    )
    first.back_off(3.0)  # the first worker met a 429 with retry-after: 3
    waiting = asyncio.ensure_future(second.enter())
    await t.advance(0.0)
    await t.advance(2.0)
    assert not waiting.done()  # the second worker waits, though it never saw the 429
    await t.advance(1.0)
    assert (await waiting).waited_s == 3.0
    second.back_off(1.0)  # and its own 429s reach the first in turn
    waiting = asyncio.ensure_future(first.enter())
    await t.advance(0.0)
    assert not waiting.done()
    await t.advance(1.0)
    assert (await waiting).waited_s == 1.0


def test_the_parent_of_workers_names_the_shared_pause_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(SHARED_PAUSES_ENV, str(tmp_path))
    limiter = build_limiter(RateLimitConfig(requests_per_minute=60), provider="deepseek:deepseek-chat")
    assert isinstance(limiter, LocalLimiter) and limiter.shared is not None
    assert limiter.shared.path == tmp_path / "deepseek_deepseek-chat.pause"


async def test_a_429_through_the_sdk_pauses_the_provider_beyond_the_key_that_got_it(tmp_path: Path) -> None:
    """Two keys: without the limiter the retry would go at once on the other key. With it, the provider is
    paused for the server's retry-after, and the retry's ledger line shows the wait."""
    rule = {"fault": "status", "status": 429, "retry_after_s": 2.0, "attempts": [1]}
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump({**SCRIPT, "faults": {"rules": [rule]}}))
    os.environ["FLOWLLM_TEST_K1"], os.environ["FLOWLLM_TEST_K2"] = "key-one", "key-two"
    try:
        cfg = provider_cfg(name="keyed", protocol="anthropic", emulator_script=str(path))
        cfg.api_key_env = "FLOWLLM_TEST_K1,FLOWLLM_TEST_K2"
        cfg.retry.max_retry_after_s = 10.0
        cfg.rate_limit = RateLimitConfig(requests_per_minute=6000)
        t = FakeTime()
        ledger = UsageLedger(None)
        async with open_provider(cfg, ledger=ledger, clock=t.clock, sleep=t.sleep) as provider:
            reply = await ask(provider, "a")
    finally:
        del os.environ["FLOWLLM_TEST_K1"], os.environ["FLOWLLM_TEST_K2"]
    assert reply.text.endswith("{42}")
    first, retry = ledger.attempts()
    assert first["outcome"] == "rate_limit" and retry["outcome"] == "ok"
    assert first["key"] != retry["key"]  # the other key was ready: only the limiter made it wait
    assert retry["limiter_wait_s"] == pytest.approx(2.0)


# ----- bad values --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [("requests_per_minute", 0), ("requests_per_minute", -5), ("tokens_per_minute", 0), ("max_in_flight", 0)],
)
def test_a_limit_of_zero_or_below_is_refused_before_the_first_task(field: str, value: float) -> None:
    cfg = provider_cfg(protocol="openai_chat", emulator_script=None, name="local", base_url="http://x")
    setattr(cfg.rate_limit, field, value)
    with pytest.raises(ProviderConfigError, match=f"rate_limit.{field} must be above 0"):
        check_provider_config(cfg)


def test_a_bad_limit_on_the_command_line_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = run_app(
        ["progress=false", "provider.rate_limit.max_in_flight=0"],
        cwd=tmp_path,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "flowllm: error: provider 'offline': rate_limit.max_in_flight must be above 0 (or null for no limit), not 0"
    ]


def test_no_limit_is_no_limiter() -> None:
    assert isinstance(build_limiter(RateLimitConfig()), Unlimited)


async def test_tokens_beyond_the_estimate_are_charged_to_the_next_request() -> None:
    limiter = LocalLimiter(RateLimitConfig(tokens_per_minute=600_000))  # 10,000 a second, 100,000 at once
    assert limiter.counts_tokens and limiter.tokens is not None and limiter.tokens.max_rate == 100_000
    slot = await limiter.enter(estimated_tokens=1_000)
    assert slot.tokens == 1_000
    limiter.leave(slot, used_tokens=1_600)  # the reply's output tokens were not in the estimate
    assert limiter.debt == 600
    following = await limiter.enter(estimated_tokens=10)
    assert limiter.debt == 0 and following.tokens == 10
    limiter.leave(following, used_tokens=5)  # fewer than estimated: no credit, no debt
    assert limiter.debt == 0
    huge = await limiter.enter(estimated_tokens=10**9)  # bigger than the bucket: waits for a full one, then goes
    limiter.leave(huge)
