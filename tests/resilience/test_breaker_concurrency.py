"""The circuit breaker under real concurrency: 50 tasks through the real SDK against the loopback emulator.

Threshold 1, faults by schedule, real time (a short recovery timeout), no fake clock: the tasks really
interleave. Each task makes three calls in a row (an agent's turns). Every request answers after 50 ms, so a
half-open trial takes long enough for the other tasks to pile up behind it. Scheduled faults on turn 2:

* t00-t04: 503 on attempts 1 and 2, answered on attempt 3 (max_attempts=3: a retry can save them);
* t05-t09: 503 on attempt 1 only;
* t49 (no fallback only): 503 on every attempt: nothing can save it.

What must hold: the ledger stays bounded by calls x attempts (no line per spin of a waiting task), every
task a retry could save is saved, the breaker ends closed with no trial left in flight.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from flowllm.config.provider_schema import BreakerConfig, RetryConfig
from flowllm.core.interfaces import CallContext
from flowllm.providers import ProviderCallError, open_provider
from flowllm.providers.breaker import CLOSED, OPEN
from flowllm.providers.ledger import UsageLedger

from .conftest import provider_cfg

N_TASKS = 50
TURNS = 3
MAX_ATTEMPTS = 3
TWICE = [f"t{i:02d}" for i in range(5)]
ONCE = [f"t{i:02d}" for i in range(5, 10)]
DOOMED = "t49"
SYSTEM = [{"type": "text", "text": "Be brief."}]


def _messages(turn: int) -> list[dict[str, Any]]:
    """The history at ``turn``: the emulator counts the turn from the assistant messages in it."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    for _ in range(turn - 1):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Thinking."}]})
        messages.append({"role": "user", "content": [{"type": "text", "text": "Go on."}]})
    return messages


def _script(tmp_path: Path, name: str, rules: list[dict[str, Any]]) -> str:
    path = tmp_path / f"{name}.yaml"
    script = {"default": [{"text": "The answer is \\boxed{42}"}], "faults": {"seed": 3, "rules": rules}}
    path.write_text(yaml.safe_dump(script))
    return str(path)


def _primary_rules(doomed: bool) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = [
        {"fault": "status", "status": 503, "tasks": TWICE, "turns": [2], "attempts": [1, 2]},
        {"fault": "status", "status": 503, "tasks": ONCE, "turns": [2], "attempts": [1]},
    ]
    if doomed:
        rules.append({"fault": "status", "status": 503, "tasks": [DOOMED], "turns": [2]})
    rules.append({"fault": "delay", "delay_s": 0.05})  # every other request: a slow, correct answer
    return rules


async def _task(provider: Any, task_id: str) -> str:
    """Three calls in a row, as an agent's turns; the first error ends the task."""
    for turn in range(1, TURNS + 1):
        request = provider.build_request(system=SYSTEM, messages=_messages(turn), tools=[])
        try:
            raw = await provider.send(request, context=CallContext(task_id, turn, "main"))
        except ProviderCallError as error:
            return f"failed: {error.kind}"
        provider.normalize(raw)
    return "ok"


async def _run(tmp_path: Path, *, fallback: bool) -> tuple[dict[str, str], list[dict[str, Any]], Any]:
    cfg = provider_cfg(
        name="primary",
        protocol="anthropic",
        emulator_script=_script(tmp_path, "primary", _primary_rules(doomed=not fallback)),
        retry=RetryConfig(max_attempts=MAX_ATTEMPTS, base_delay_s=0.01, max_delay_s=0.02, max_total_s=60.0),
        breaker=BreakerConfig(failure_threshold=1, recovery_timeout_s=0.2),
        timeout_s=60.0,  # a loaded machine must not turn a slow answer into a timeout the schedule did not plan
    )
    configs = {}
    if fallback:
        cfg.fallbacks = ["backup"]
        configs["backup"] = provider_cfg(
            name="backup",
            protocol="openai_chat",
            emulator_script=_script(tmp_path, "backup", [{"fault": "delay", "delay_s": 0.05}]),
            breaker=BreakerConfig(failure_threshold=1, recovery_timeout_s=0.2),
            timeout_s=60.0,
        )
    path = tmp_path / "usage.jsonl"
    ledger = UsageLedger(path)
    async with open_provider(cfg, ledger=ledger, resolve=configs.__getitem__) as provider:
        ids = [f"t{i:02d}" for i in range(N_TASKS)]
        outcomes = await asyncio.wait_for(asyncio.gather(*(_task(provider, t) for t in ids)), timeout=120)
        breakers = {rid: (r.breaker.state, r.breaker.trial_in_flight) for rid, r in provider.routes.items()}
    ledger.close()
    lines = [line.to_dict() for line in UsageLedger.read(path).lines]
    return dict(zip(ids, outcomes, strict=True)), lines, breakers


def _check_bounded(lines: list[dict[str, Any]], routes: int) -> None:
    calls = sum(1 for line in lines if line["type"] == "call")
    transitions = sum(1 for line in lines if line["type"] == "breaker")
    by_type: dict[str, int] = {}
    for line in lines:
        by_type[line["type"]] = by_type.get(line["type"], 0) + 1
    print(f"ledger: {len(lines)} lines {by_type}")
    assert calls <= N_TASKS * TURNS
    assert by_type.get("attempt", 0) <= calls * MAX_ATTEMPTS * routes
    assert by_type.get("skip", 0) <= calls * routes  # at most one per call and provider, never one per spin
    assert len(lines) <= calls * (MAX_ATTEMPTS * routes + routes + 1) + transitions
    # Each call's attempts on one provider are numbered 1..n without a gap or repeat, n <= max_attempts.
    numbers: dict[tuple[int, str], list[int]] = {}
    for line in lines:
        if line["type"] == "attempt":
            numbers.setdefault((line["call"], line["provider"]), []).append(line["attempt"])
    for got in numbers.values():
        assert got == list(range(1, len(got) + 1)) and len(got) <= MAX_ATTEMPTS


async def test_fifty_concurrent_tasks_without_a_fallback(tmp_path: Path) -> None:
    outcomes, lines, breakers = await _run(tmp_path, fallback=False)
    _check_bounded(lines, routes=1)
    failed = {t: o for t, o in outcomes.items() if o != "ok"}
    # Every task but the doomed one is saved by waiting for the recovery and retrying.
    assert failed == {DOOMED: "failed: server"}
    # No trial left "in flight" (the doomed task's last failure may have been the last event: open is fine).
    assert breakers["primary"][1] is False and breakers["primary"][0] in (CLOSED, OPEN)
    # The saved tasks got their answer from the primary itself, after a wait for the breaker.
    doomed_attempts = [a for a in lines if a["type"] == "attempt" and a["task_id"] == DOOMED and a["turn"] == 2]
    assert len(doomed_attempts) == MAX_ATTEMPTS
    assert any(line["type"] == "breaker" and line["to"] == "half_open" for line in lines)


async def test_fifty_concurrent_tasks_with_a_fallback(tmp_path: Path) -> None:
    outcomes, lines, breakers = await _run(tmp_path, fallback=True)
    _check_bounded(lines, routes=2)
    assert set(outcomes.values()) == {"ok"}
    assert breakers["backup"] == (CLOSED, False)
    assert breakers["primary"][1] is False  # no trial left in flight, whatever state the last call left
    served_by_backup = {c["task_id"] for c in lines if c["type"] == "call" and c["provider"] == "backup"}
    assert served_by_backup  # while the primary's breaker was open, the fallback served


async def test_a_trial_that_finds_no_usable_key_releases_the_breaker(tmp_path: Path) -> None:
    """The half-open trial's key pool raises before anything is sent: the trial is handed back, so a later
    call gets its own trial instead of being refused for the rest of the run."""
    from .conftest import FakeTime

    rule = {"fault": "status", "status": 429, "retry_after_s": 5.0, "tasks": ["a"]}
    cfg = provider_cfg(
        emulator_script=_script(tmp_path, "keys", [rule]),
        retry=RetryConfig(max_attempts=1, max_retry_after_s=10.0, max_total_s=60.0),
        breaker=BreakerConfig(failure_threshold=1, recovery_timeout_s=0.5),
    )
    cfg.key_pool.max_wait_s = 0.1
    t = FakeTime()
    ledger = UsageLedger(None)

    async def ask(task: str) -> str:
        request = provider.build_request(system=SYSTEM, messages=_messages(1), tools=[])
        try:
            await asyncio.wait_for(provider.send(request, context=CallContext(task, 1, "main")), timeout=30)
        except ProviderCallError as error:
            return error.kind
        return "ok"

    async with open_provider(cfg, ledger=ledger, clock=t.clock, sleep=t.sleep) as provider:
        breaker = provider.routes["offline"].breaker
        assert await ask("a") == "rate_limit"  # the 429 opens the breaker; the only key rests 5 s
        t.now += 1.0  # past the recovery timeout, before the key wakes: the trial finds no usable key
        assert await ask("b") == "rate_limit"
        assert breaker.trial_in_flight is False
        t.now += 10.0  # the key is awake: the next call is the trial, and it closes the breaker
        assert await ask("c") == "ok"
        assert breaker.state == CLOSED and breaker.trial_in_flight is False
    skips = [line for line in ledger.lines if line.type == "skip"]
    assert [s.reason for s in skips] == ["no_usable_key"]


async def test_half_open_waiters_sleep_until_the_trial_reports() -> None:
    """Waiters neither spin nor time out: they wake when the trial reports, and a late report of an
    attempt sent before the breaker opened does not decide the trial."""
    from flowllm.providers.breaker import HALF_OPEN, CircuitBreaker

    from .conftest import FakeTime

    t = FakeTime()
    breaker = CircuitBreaker("p", BreakerConfig(failure_threshold=1, recovery_timeout_s=5), clock=t.clock)
    early = breaker.admit()
    breaker.record_failure(ProviderCallError("x", kind="server"), breaker.admit())
    assert breaker.state == OPEN and breaker.admit() is None
    t.now += 5
    trial = breaker.admit()
    assert trial is not None and trial.trial and breaker.state == HALF_OPEN
    waiters = [asyncio.ensure_future(breaker.wait_admittable(60)) for _ in range(20)]
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in waiters)  # asleep on the trial, not polling
    breaker.record_failure(ProviderCallError("late", kind="server"), early)  # sent before it opened
    assert breaker.state == HALF_OPEN and breaker.trial_in_flight
    breaker.release(trial)  # e.g. the trial found no usable key
    assert await asyncio.gather(*waiters) == [True] * 20
    assert breaker.state == HALF_OPEN and not breaker.trial_in_flight
    assert breaker.admit() is not None  # the next caller gets the trial
