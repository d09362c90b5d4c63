"""The retry policy's first attempt runs without tenacity (``RetryPolicy.run``), and the reply it checked is the
one the turn reads (``CheckedReply``): a call that fails first is still retried exactly as before, and a reply is
normalised once per call.

Faults come from the emulator (its ``attempts`` rules); waits run on a fake clock, and the backoff's jitter is
drawn from a seeded generator so the waits can be compared with the policy's own, number for number.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from flowllm.providers import ProviderCallError, open_provider
from flowllm.providers.base import BaseProvider
from flowllm.providers.ledger import UsageLedger
from flowllm.providers.retry import RetryPolicy

from .conftest import FakeTime, provider_cfg
from .test_through_sdks import ask, script_file

SEED = 7


def _seeded(provider: Any) -> RetryPolicy:
    """Seed the primary's policy; returns a twin with the same seed, to draw the waits expected."""
    policy: RetryPolicy = provider.primary.policy
    policy.rng = random.Random(SEED)
    twin = RetryPolicy.from_config(provider.primary.cfg.retry)
    twin.rng = random.Random(SEED)
    return twin


async def test_a_call_that_fails_twice_is_retried_with_the_policys_backoff(tmp_path: Path) -> None:
    rule = {"fault": "status", "status": 503, "attempts": [1, 2]}
    cfg = provider_cfg(emulator_script=script_file(tmp_path, [rule]))
    cfg.breaker.failure_threshold = 10
    ledger = UsageLedger(tmp_path / "usage.jsonl")
    t = FakeTime()
    async with open_provider(cfg, ledger=ledger, clock=t.clock, sleep=t.sleep) as provider:
        twin = _seeded(provider)
        _, reply = await ask(provider)
    assert reply.text == "The answer is \\boxed{42}"
    attempts = UsageLedger.read(tmp_path / "usage.jsonl").attempts()
    assert [(a["attempt"], a["outcome"], a["status"]) for a in attempts] == [
        (1, "server", 503),
        (2, "server", 503),
        (3, "ok", None),
    ]
    # Waits after attempts 1 and 2: the policy's backoff for those attempt numbers, in that order.
    assert t.sleeps == [twin.backoff_s(1), twin.backoff_s(2)]
    calls = [line for line in ledger.lines if line.type == "call"]
    assert [(c.outcome, c.attempts) for c in calls] == [("ok", 3)]


async def test_a_failure_that_is_not_retried_is_raised_after_one_attempt(tmp_path: Path) -> None:
    cfg = provider_cfg(emulator_script=script_file(tmp_path, [{"fault": "status", "status": 400}]))
    ledger = UsageLedger(None)
    t = FakeTime()
    async with open_provider(cfg, ledger=ledger, clock=t.clock, sleep=t.sleep) as provider:
        with pytest.raises(ProviderCallError) as info:
            await ask(provider)
    assert info.value.kind == "bad_request" and info.value.status == 400
    assert [a["outcome"] for a in ledger.attempts()] == ["bad_request"] and t.sleeps == []


async def test_one_attempt_allowed_means_no_retry(tmp_path: Path) -> None:
    cfg = provider_cfg(emulator_script=script_file(tmp_path, [{"fault": "status", "status": 503, "attempts": [1]}]))
    cfg.retry.max_attempts = 1
    ledger = UsageLedger(None)
    t = FakeTime()
    async with open_provider(cfg, ledger=ledger, clock=t.clock, sleep=t.sleep) as provider:
        with pytest.raises(ProviderCallError) as info:
            await ask(provider)
    assert info.value.kind == "server"
    assert [a["outcome"] for a in ledger.attempts()] == ["server"] and t.sleeps == []


async def test_the_reply_is_normalised_once_per_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[dict[str, Any]] = []
    original = BaseProvider.normalize

    def counting(self: BaseProvider, raw: dict[str, Any]) -> Any:
        reads.append(raw)
        return original(self, raw)

    monkeypatch.setattr(BaseProvider, "normalize", counting)
    cfg = provider_cfg(emulator_script=script_file(tmp_path, [{"fault": "status", "status": 503, "attempts": [1]}]))
    t = FakeTime()
    async with open_provider(cfg, ledger=UsageLedger(None), clock=t.clock, sleep=t.sleep) as provider:
        raw, reply = await ask(provider)  # a failed attempt (not read: it has no reply), then the answer
        assert len(reads) == 1 and reply.text.endswith("{42}") and reply.usage.output_tokens > 0
        # The reply is still a dict like any other, and a second reading reads it again, to the same result.
        assert dict(raw) == raw and provider.normalize(raw) == reply and len(reads) == 2
