"""Every fault class through the real SDKs against the emulator, and what the resilience layer makes of it.

Waits run on a fake clock (instant, recorded), so retry-after and cooldowns are checked without sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowllm.config.provider_schema import ProviderConfig
from flowllm.core.interfaces import CallContext
from flowllm.emulator import Emulator
from flowllm.emulator.faults import FaultPlan
from flowllm.providers import ProviderCallError, open_provider
from flowllm.providers.ledger import UsageLedger
from flowllm.providers.resilient import ROUTE_KEY

from .conftest import FakeTime, provider_cfg

pytestmark = pytest.mark.long

PROTOCOLS = ("anthropic", "openai_chat", "openai_responses")
SYSTEM = [{"type": "text", "text": "Be brief."}]
HELLO = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
SCRIPT = {"default": [{"text": "The answer is \\boxed{42}"}]}

# One recoverable fault of each class, on the first attempt only (attempts: [1]).
RECOVERABLE: dict[str, dict[str, Any]] = {
    "rate_limit": {"fault": "status", "status": 429, "retry_after_s": 0.25},
    "overloaded": {"fault": "status", "status": 529},
    "server": {"fault": "status", "status": 503},
    "timeout": {"fault": "status", "status": 408},
    "conflict": {"fault": "status", "status": 409},
    "connection": {"fault": "reset"},
    "truncated": {"fault": "truncate"},
    "stream_error": {"fault": "stream_error", "error_type": "overloaded_error"},
    "bad_response": {"fault": "malformed"},
    "empty_reply": {"fault": "empty"},
}
EXPECTED_KIND = {"stream_error": "overloaded"}  # a mid-stream overloaded_error is classified by its type


def script_file(tmp_path: Path, rules: list[dict[str, Any]], name: str = "script.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**SCRIPT, "faults": {"seed": 1, "rules": rules}}))
    return str(path)


async def ask(provider: Any, task: str = "t1", turn: int = 1, agent: str = "main") -> tuple[dict[str, Any], Any]:
    request = provider.build_request(system=SYSTEM, messages=HELLO, tools=[])
    raw = await provider.send(request, context=CallContext(task, turn, agent))
    return raw, provider.normalize(raw)


@pytest.fixture(scope="module")
def shared_emulator() -> Iterator[Emulator]:
    """One emulator for the fault-class matrix: each test has its own task id, which its rule is scheduled on."""
    rules = [
        {**rule, "tasks": [f"{kind}-{protocol}"], "attempts": [1]}
        for kind, rule in RECOVERABLE.items()
        for protocol in PROTOCOLS
    ]
    with Emulator(SCRIPT, faults=FaultPlan.parse({"rules": rules})) as emu:
        yield emu


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("kind", sorted(RECOVERABLE))
async def test_each_fault_class_is_retried_and_recorded(
    tmp_path: Path, shared_emulator: Emulator, protocol: str, kind: str
) -> None:
    t = FakeTime()
    base = shared_emulator.base_url if protocol == "anthropic" else shared_emulator.openai_base_url
    cfg = provider_cfg(protocol=protocol, stream=True, base_url=base)
    ledger = UsageLedger(tmp_path / "usage.jsonl")
    async with open_provider(cfg, ledger=ledger, clock=t.clock, sleep=t.sleep) as provider:
        raw, reply = await ask(provider, task=f"{kind}-{protocol}")
    assert reply.text == "The answer is \\boxed{42}"
    attempts = UsageLedger.read(tmp_path / "usage.jsonl").attempts()
    assert [a["outcome"] for a in attempts] == [EXPECTED_KIND.get(kind, kind), "ok"]
    assert attempts[1]["usage"]["output_tokens"] > 0
    if kind == "empty_reply":  # it arrived, was read and is of no use: billed all the same, as the provider bills it
        assert attempts[0]["usage"]["input_tokens"] > 0
    else:  # refused, cut or unreadable: nothing billed
        assert attempts[0]["usage"]["input_tokens"] == attempts[0]["usage"]["output_tokens"] == 0
    assert raw[ROUTE_KEY]["provider"] == "offline" and raw[ROUTE_KEY]["fallback"] is False
    if kind == "rate_limit":
        assert attempts[0]["retry_after_s"] == 0.25
        # The key rested exactly the server's retry-after (tenacity's own wait is 0: the pool does the waiting).
        assert [s for s in t.sleeps if s] == [pytest.approx(0.25)]


@pytest.mark.parametrize("check", [True, False])
async def test_a_reply_read_in_the_send_is_billed_whether_or_not_it_is_checked(tmp_path: Path, check: bool) -> None:
    """retry.check_reply=false lets an unusable reply through unretried (the turn's normalize fails on it); every
    reply is still read in the send for its bill: none is billed as nothing."""
    cfg = provider_cfg(emulator_script=script_file(tmp_path, [{"fault": "empty", "attempts": [1]}]))
    cfg.retry.check_reply = check
    ledger = UsageLedger(None)
    async with open_provider(cfg, ledger=ledger) as provider:
        request = provider.build_request(system=SYSTEM, messages=HELLO, tools=[])
        raw = await provider.send(request, context=CallContext("t1", 1, "main"))
        if check:
            assert provider.normalize(raw).text.endswith("{42}")
        else:
            with pytest.raises(ProviderCallError, match="empty reply"):
                provider.normalize(raw)
        raw = await provider.send(request, context=CallContext("t1", 2, "main"))  # answered: read once, billed
        assert provider.normalize(raw).text.endswith("{42}")
    attempts = ledger.attempt_lines()
    assert [a.outcome for a in attempts] == (["empty_reply", "ok", "ok"] if check else ["ok", "ok"])
    assert all(a.billed and a.usage and a.usage["input_tokens"] > 0 for a in attempts)
    assert ledger.usage().input_tokens == sum(a.usage["input_tokens"] for a in attempts if a.usage)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_delayed_answer_past_the_timeout_is_retried(tmp_path: Path, protocol: str) -> None:
    # The delay is far past the timeout and the timeout far above a loopback reply on a loaded machine.
    rule = {"fault": "delay", "delay_s": 8, "attempts": [1]}
    cfg = provider_cfg(protocol=protocol, timeout_s=2, emulator_script=script_file(tmp_path, [rule]))
    ledger = UsageLedger(None)
    t = FakeTime()
    async with open_provider(cfg, ledger=ledger, clock=t.clock, sleep=t.sleep) as provider:
        _, reply = await ask(provider)
    assert reply.text.endswith("{42}")
    assert [a["outcome"] for a in ledger.attempts()] == ["timeout", "ok"]


@pytest.mark.parametrize(
    ("rule", "kind"),
    [
        ({"fault": "status", "status": 400, "code": "context_length_exceeded"}, "context_length"),
        ({"fault": "status", "status": 400}, "bad_request"),
        ({"fault": "status", "status": 404, "error_type": "not_found_error"}, "not_found"),
    ],
)
async def test_request_faults_are_never_retried(tmp_path: Path, rule: dict[str, Any], kind: str) -> None:
    cfg = provider_cfg(protocol="openai_chat", emulator_script=script_file(tmp_path, [rule]))
    ledger = UsageLedger(None)
    async with open_provider(cfg, ledger=ledger) as provider:
        with pytest.raises(ProviderCallError) as info:
            await ask(provider)
    assert info.value.kind == kind
    assert [a["outcome"] for a in ledger.attempts()] == [kind]
    assert [c.outcome for c in ledger.lines if c.type == "call"] == [kind]


async def test_retries_stop_at_max_attempts_with_the_last_error(tmp_path: Path) -> None:
    cfg = provider_cfg(emulator_script=script_file(tmp_path, [{"fault": "status", "status": 500}]))
    cfg.breaker.failure_threshold = 10
    ledger = UsageLedger(None)
    t = FakeTime()
    async with open_provider(cfg, ledger=ledger, clock=t.clock, sleep=t.sleep) as provider:
        with pytest.raises(ProviderCallError) as info:
            await ask(provider)
    assert info.value.kind == "server" and info.value.status == 500
    assert len(ledger.attempts()) == 3 and len(t.sleeps) == 2
    assert all(0.005 <= s <= 0.05 for s in t.sleeps)  # backoff within [base/2, max_delay]


async def test_a_rate_limited_key_is_skipped_until_its_cooldown_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWLLM_T_KA", "key-a")
    monkeypatch.setenv("FLOWLLM_T_KB", "key-b")
    # key-a is rate limited on its first use (task t1) and says: come back in 30 s.
    rule = {"fault": "status", "status": 429, "retry_after_s": 30, "api_keys": ["key-a"], "tasks": ["t1"]}
    cfg = provider_cfg(api_key_env="FLOWLLM_T_KA,FLOWLLM_T_KB", emulator_script=script_file(tmp_path, [rule]))
    cfg.retry.max_retry_after_s = 60
    ledger = UsageLedger(None)
    t = FakeTime()
    async with open_provider(cfg, ledger=ledger, clock=t.clock, sleep=t.sleep) as provider:
        await ask(provider, "t1")  # key-a: 429; key-b answers at once
        for i in range(2, 6):
            await ask(provider, f"t{i}")  # key-a rests: every call goes to key-b
        t.now += 30
        for i in range(6, 9):
            await ask(provider, f"t{i}")  # rested: round robin again
    keys = [(a["key"], a["outcome"]) for a in ledger.attempts()]
    assert keys[:2] == [("FLOWLLM_T_KA", "rate_limit"), ("FLOWLLM_T_KB", "ok")]
    assert [k for k, _ in keys[2:6]] == ["FLOWLLM_T_KB"] * 4
    assert sorted(k for k, _ in keys[6:9]) == ["FLOWLLM_T_KA", "FLOWLLM_T_KA", "FLOWLLM_T_KB"]
    assert not any(t.sleeps)  # another key was ready each time: no waiting
    assert "key-a" not in str(ledger.lines) and "key-b" not in str(ledger.lines)


async def test_a_refused_key_is_retired_and_the_next_key_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FLOWLLM_T_POOL", "bad-key,good-key")
    rule = {"fault": "status", "status": 401, "api_keys": ["bad-key"]}
    cfg = provider_cfg(api_key_env="FLOWLLM_T_POOL", emulator_script=script_file(tmp_path, [rule]))
    ledger = UsageLedger(None)
    async with open_provider(cfg, ledger=ledger) as provider:
        for i in range(3):
            await ask(provider, f"t{i}")
        summary = provider.summary()  # type: ignore[attr-defined]
    assert [(a["key"], a["outcome"]) for a in ledger.attempts()] == [
        ("FLOWLLM_T_POOL[1]", "auth"),
        ("FLOWLLM_T_POOL[2]", "ok"),
        ("FLOWLLM_T_POOL[2]", "ok"),
        ("FLOWLLM_T_POOL[2]", "ok"),
    ]
    assert summary["keys"]["offline"]["FLOWLLM_T_POOL[1]"]["retired"] is True
    assert "FLOWLLM_T_POOL[1]" in caplog.text and "bad-key" not in caplog.text


async def test_fallback_to_another_protocol_with_breaker_open_half_open_closed(tmp_path: Path) -> None:
    # The primary is down for tasks down-*; the fallback speaks another protocol from its own emulator.
    down = {"fault": "status", "status": 529, "tasks": ["down-1", "down-2", "down-3"]}
    primary = provider_cfg(name="primary", emulator_script=script_file(tmp_path, [down]), fallbacks=["backup"])
    backup = provider_cfg(
        name="backup", protocol="openai_responses", emulator_script=script_file(tmp_path, [], "b.yaml")
    )
    configs = {"backup": backup}
    ledger = UsageLedger(None)
    t = FakeTime()
    async with open_provider(
        primary, ledger=ledger, resolve=configs.__getitem__, clock=t.clock, sleep=t.sleep
    ) as provider:
        raw, reply = await ask(provider, "down-1")  # 3 attempts fail: breaker opens, backup answers
        assert raw[ROUTE_KEY] | {"request": None} == {
            "provider": "backup",
            "protocol": "openai_responses",
            "model": "flowllm-emulator",
            "fallback": True,
            "request": None,
        }
        assert raw[ROUTE_KEY]["request"]["input"]  # the Responses request really sent, kept with the reply
        assert reply.text.endswith("{42}")
        await ask(provider, "down-2")  # breaker open: straight to backup, primary not even tried
        t.now += 10  # recovery timeout: one trial, which still fails
        await ask(provider, "down-3")
        t.now += 10
        raw, _ = await ask(provider, "up-1")  # trial succeeds: closed again
        assert raw[ROUTE_KEY]["provider"] == "primary"
        summary = provider.summary()  # type: ignore[attr-defined]
    route = [(a["provider"], a["outcome"]) for a in ledger.attempts()]
    assert route == [
        ("primary", "overloaded"),
        ("primary", "overloaded"),
        ("primary", "overloaded"),
        ("backup", "ok"),
        ("backup", "ok"),
        ("primary", "overloaded"),
        ("backup", "ok"),
        ("primary", "ok"),
    ]
    transitions = [(x["from"], x["to"]) for x in summary["breaker_transitions"]["primary"]]
    assert transitions == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]
    assert summary["fallbacks_taken"] == 3 and summary["by_provider"]["backup"]["answered_calls"] == 3
    assert summary["skips"] == {"primary": {"breaker_open": 1}}


async def test_when_every_provider_fails_the_error_names_each(tmp_path: Path) -> None:
    boom = [{"fault": "status", "status": 503}]
    primary = provider_cfg(name="primary", emulator_script=script_file(tmp_path, boom), fallbacks=["backup"])
    backup = provider_cfg(name="backup", protocol="openai_chat", emulator_script=script_file(tmp_path, boom, "b.yaml"))
    t = FakeTime()
    async with open_provider(primary, resolve={"backup": backup}.__getitem__, clock=t.clock, sleep=t.sleep) as p:
        with pytest.raises(ProviderCallError) as info:
            await ask(p)
    assert "every provider failed" in str(info.value)
    assert "primary: server (HTTP 503)" in str(info.value) and "backup: server (HTTP 503)" in str(info.value)


async def test_agent_models_route_a_sub_agent_to_its_own_provider(tmp_path: Path) -> None:
    primary = provider_cfg(name="primary", emulator_script=script_file(tmp_path, []))
    primary.aliases = {"fast": "small"}
    primary.agent_models = {"browser": "fast"}
    small = provider_cfg(name="small", protocol="openai_chat", emulator_script=script_file(tmp_path, [], "s.yaml"))
    ledger = UsageLedger(None)
    async with open_provider(primary, ledger=ledger, resolve={"small": small}.__getitem__) as provider:
        main_raw, _ = await ask(provider, agent="main")
        sub_raw, sub_reply = await ask(provider, agent="browser")
    assert main_raw[ROUTE_KEY]["provider"] == "primary" and sub_raw[ROUTE_KEY]["provider"] == "small"
    assert sub_reply.text.endswith("{42}")
    assert ledger.summary()["by_agent"]["browser"]["successes"] == 1


@pytest.mark.parametrize("where", ["in_flight", "while_waiting"])
async def test_cancellation_propagates_and_is_never_retried(tmp_path: Path, where: str) -> None:
    if where == "in_flight":
        rule: dict[str, Any] = {"fault": "delay", "delay_s": 0.5}
        sleep: Any = asyncio.sleep
    else:
        rule = {"fault": "status", "status": 529, "retry_after_s": 60}
        sleep = asyncio.sleep  # a real (long) wait: cancelled in the middle of it
    cfg: ProviderConfig = provider_cfg(emulator_script=script_file(tmp_path, [rule]))
    cfg.retry.max_retry_after_s = 60
    ledger = UsageLedger(None)
    async with open_provider(cfg, ledger=ledger, sleep=sleep) as provider:
        call = asyncio.create_task(ask(provider))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if where == "in_flight" or ledger.attempts():
                break
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert len(ledger.attempts()) == (0 if where == "in_flight" else 1)
