"""A 200-task run through the real app, with 20% injected faults of every class, an outage and doomed tasks.

The primary (Anthropic protocol, streamed) meets a fault on 20% of its requests, spread over ten classes; the
fallback (OpenAI Chat, streamed, its own emulator) on 5%. Tasks t150-t157 meet a full outage of the primary
(the breaker opens and the fallback serves), t042's prompt is "too long" (failed, never retried, no fallback),
and t099 fails on both providers. The run is serial (experiment.max_concurrent=1) so that the breaker's story
is one deterministic sequence, which the test rebuilds from the ledger with its own small state machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir

import flowllm.app as app_module
from flowllm.config.schema import register_configs
from flowllm.core.types import Usage
from flowllm.emulator.faults import Draw, FaultPlan
from flowllm.providers.ledger import UsageLedger
from flowllm.resources import CONFIG_DIR

pytestmark = pytest.mark.long

N_TASKS = 200
OUTAGE = [f"t{i:03d}" for i in range(150, 158)]
RANDOM_FAULTS = [  # 10 classes x 2% = 20% of the primary's requests
    {"fault": "status", "status": 429, "retry_after_s": 0.01, "rate": 0.02},
    {"fault": "status", "status": 529, "rate": 0.02},
    {"fault": "status", "status": 500, "rate": 0.02},
    {"fault": "status", "status": 503, "retry_after_s": 0.005, "rate": 0.02},
    {"fault": "reset", "rate": 0.02},
    # Far past provider.timeout_s, which is far above a loopback reply on a loaded machine: always a timeout,
    # never a slow success.
    {"fault": "delay", "delay_s": 30, "rate": 0.02},
    {"fault": "truncate", "rate": 0.02},
    {"fault": "stream_error", "error_type": "overloaded_error", "rate": 0.02},
    {"fault": "malformed", "rate": 0.02},
    {"fault": "empty", "rate": 0.02},
]
PRIMARY_FAULTS = [
    {"fault": "status", "status": 400, "code": "context_length_exceeded", "tasks": ["t042"]},
    {"fault": "status", "status": 503, "tasks": ["t099"]},
    {"fault": "status", "status": 529, "tasks": OUTAGE},
    *RANDOM_FAULTS,
]
BACKUP_FAULTS = [
    {"fault": "status", "status": 503, "tasks": ["t099"]},
    {"fault": "status", "status": 500, "rate": 0.02},
    {"fault": "truncate", "rate": 0.015},
    {"fault": "malformed", "rate": 0.015},
]
THRESHOLD = 3
ATTEMPTS = 3
# What each injected fault is classified as, by the real SDKs and errors.py.
FAULT_KIND = {
    "status:429": "rate_limit",
    "status:529": "overloaded",
    "status:500": "server",
    "status:503": "server",
    "status:400": "context_length",
    "reset": "connection",
    "delay": "timeout",
    "truncate": "truncated",
    "stream_error": "overloaded",
    "malformed": "bad_response",
    "empty": "empty_reply",
}


def rule_kind(rule: Any) -> str | None:
    if rule is None:
        return None
    return FAULT_KIND[f"status:{rule.status}" if rule.fault == "status" else rule.fault]


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fault_run")
    data = root / "data"
    data.mkdir()
    with (data / "metadata.jsonl").open("w") as out:
        for i in range(N_TASKS):
            task = {
                "task_id": f"t{i:03d}",
                "Question": f"What is {i} + 1?",
                "Level": 1 + i % 3,
                "Final answer": str(i + 1),
                "file_name": "",
            }
            out.write(json.dumps(task) + "\n")
    replies = {f"t{i:03d}": [{"text": f"Easy. \\boxed{{{i + 1}}}"}] for i in range(N_TASKS)}
    (root / "primary.yaml").write_text(
        yaml.safe_dump({"tasks": replies, "faults": {"seed": 11, "rules": PRIMARY_FAULTS}})
    )
    (root / "backup.yaml").write_text(yaml.safe_dump({"tasks": replies, "faults": {"seed": 5, "rules": BACKUP_FAULTS}}))
    providers = root / "provider"
    providers.mkdir()
    (providers / "backup.yaml").write_text(
        "defaults:\n  - base_provider\n  - _self_\n\nname: backup\nprotocol: openai_chat\nmodel: flowllm-emulator\n"
        f"stream: true\ntimeout_s: 2\nemulator_script: {root / 'backup.yaml'}\n"
        "retry: {max_attempts: 3, base_delay_s: 0.001, max_delay_s: 0.005, max_retry_after_s: 0.02}\n"
    )
    overrides = [
        "tools=none",
        "runner=graph",
        f"dataset.path={data}",
        "experiment.max_concurrent=1",
        "agent.max_turns=2",
        "progress=false",
        "recorder.snapshot=all",
        f"provider.emulator_script={root / 'primary.yaml'}",
        "provider.stream=true",
        "provider.timeout_s=2",
        "provider.fallbacks=[backup]",
        f"provider.config_dir={providers}",
        f"provider.retry.max_attempts={ATTEMPTS}",
        "provider.retry.base_delay_s=0.001",
        "provider.retry.max_delay_s=0.005",
        "provider.retry.max_retry_after_s=0.02",
        f"provider.breaker.failure_threshold={THRESHOLD}",
        "provider.breaker.recovery_timeout_s=0",  # every call after an opening is a trial: order decides, not time
        "provider.key_pool.cooldown_s=0.01",
    ]
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    run_dir = root / "run"

    summary = app_module.run(cfg, run_dir)
    return {"summary": summary, "run_dir": run_dir, "ledger": UsageLedger.read(run_dir / "usage.jsonl")}


def results(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "tasks").glob("*/result.json")}


def test_every_task_completes_or_fails_with_a_stated_reason(fault_run: dict[str, Any]) -> None:
    outcomes = results(fault_run["run_dir"])
    assert len(outcomes) == N_TASKS
    failed = {tid: r["error"] for tid, r in outcomes.items() if r["status"] != "completed"}
    assert set(failed) == {"t042", "t099"}, failed
    assert "context_length" in failed["t042"]
    assert "every provider failed" in failed["t099"] and "server (HTTP 503)" in failed["t099"]
    completed = [r for r in outcomes.values() if r["status"] == "completed"]
    assert all(r["correct"] for r in completed)  # no half reply, empty reply or garbage was ever used
    assert fault_run["summary"]["completed"] == N_TASKS - 2


def test_the_ledger_accounts_for_every_attempt(fault_run: dict[str, Any]) -> None:
    ledger: UsageLedger = fault_run["ledger"]
    primary = FaultPlan.parse({"seed": 11, "rules": PRIMARY_FAULTS})
    backup = FaultPlan.parse({"seed": 5, "rules": BACKUP_FAULTS})
    seen: dict[tuple[str, str], int] = {}
    for line in ledger.attempts():
        key = (line["provider"], line["task_id"])
        seen[key] = seen.get(key, 0) + 1
        plan, protocol = (primary, "anthropic") if line["provider"] == "offline" else (backup, "openai_chat")
        rule = plan.pick(Draw(line["task_id"], "main", line["turn"], seen[key], protocol, True))
        # Exactly the fault the emulator drew for this request, or a success: nothing lost, nothing invented.
        assert line["outcome"] == (rule_kind(rule) or "ok"), line
    calls = [line.to_dict() for line in ledger.lines if line.type == "call"]
    assert len(calls) == N_TASKS  # one turn each
    ok_attempts = [a for a in ledger.attempts() if a["outcome"] == "ok"]
    assert len(ok_attempts) == sum(c["outcome"] == "ok" for c in calls)
    injected = sum(a["outcome"] != "ok" for a in ledger.attempts())
    assert injected > 0.2 * N_TASKS  # the faults really happened, of every class:
    assert {a["outcome"] for a in ledger.attempts()} >= set(FAULT_KIND.values())


def test_the_ledger_adds_up_to_the_summary(fault_run: dict[str, Any]) -> None:
    ledger: UsageLedger = fault_run["ledger"]
    summary = fault_run["summary"]
    outcomes = results(fault_run["run_dir"])
    completed = {tid for tid, r in outcomes.items() if r["status"] == "completed"}
    billed = Usage()
    for line in ledger.attempts():
        if line["outcome"] == "ok" and line["task_id"] in completed:
            billed = billed + Usage.from_dict(line["usage"])
    assert billed.to_dict() == summary["usage"]
    for tid in list(completed)[:20]:
        per_task = sum(
            (Usage.from_dict(a["usage"]) for a in ledger.attempts() if a["task_id"] == tid and a["outcome"] == "ok"),
            Usage(),
        )
        assert per_task.to_dict() == outcomes[tid]["usage"]
    # An empty reply arrived and was read, then refused and retried: the provider billed it, so the run did.
    empty = [line for line in ledger.attempt_lines() if line.outcome == "empty_reply"]
    assert empty and all(line.billed and (line.cost_usd or 0) > 0 for line in empty)
    assert summary["cost_usd"] == pytest.approx(sum(line.cost_usd or 0 for line in ledger.attempt_lines()), abs=1e-5)
    totals = ledger.summary()
    assert totals["calls"] == N_TASKS and totals["calls_ok"] == N_TASKS - 2
    assert totals["attempts"] == sum(p["attempts"] for p in totals["by_provider"].values())
    assert sum(b["attempts"] for b in totals["hourly"]) == totals["attempts"]


def test_fallbacks_and_breaker_transitions_are_the_expected_ones(fault_run: dict[str, Any]) -> None:
    ledger: UsageLedger = fault_run["ledger"]
    # An independent model of the breaker (threshold 3, recovery 0 s), fed the primary's attempts in order.
    state, failures, expected = "closed", 0, []
    for line in ledger.attempts():
        if line["provider"] != "offline":
            continue
        if state == "open":  # recovery timeout 0: the next call is the trial
            expected.append(("open", "half_open"))
            state = "half_open"
        if line["outcome"] in ("ok", "context_length"):
            failures = 0
            if state == "half_open":
                expected.append(("half_open", "closed"))
                state = "closed"
        else:
            failures += 1
            if state == "half_open":
                expected.append(("half_open", "open"))
                state = "open"
            elif failures >= THRESHOLD:
                expected.append(("closed", "open"))
                state = "open"
    breakers = [b for b in ledger.lines if b.type == "breaker"]
    recorded = [(b.from_state, b.to_state) for b in breakers if b.provider == "offline"]
    assert recorded == expected
    assert state == "closed"  # recovered after the outage
    # The outage opened the breaker on its first task, and every outage call after it was a single trial.
    first_open = next(b for b in breakers if b.to_state == "open")
    assert first_open.ts is not None and first_open.ts >= 0
    for tid in OUTAGE[1:]:
        tries = [a for a in ledger.attempts() if a["task_id"] == tid and a["provider"] == "offline"]
        assert len(tries) == 1 and tries[0]["outcome"] == "overloaded"
    # Every call the primary could not answer was answered by the fallback (except the two doomed tasks).
    calls = {c["task_id"]: c for c in (line.to_dict() for line in ledger.lines) if c["type"] == "call"}
    for tid in OUTAGE:
        assert calls[tid]["provider"] == "backup" and calls[tid]["fallback"] is True
    summary = ledger.summary()
    taken = sum(1 for c in calls.values() if c["outcome"] == "ok" and c["provider"] == "backup")
    assert summary["fallbacks_taken"] == taken >= len(OUTAGE)
    assert summary["by_provider"]["backup"]["answered_calls"] == taken
    assert summary["by_provider"]["offline"]["answered_calls"] == N_TASKS - 2 - taken
    # And the saved raw reply of each turn says who answered it.
    run_dir = fault_run["run_dir"]
    for tid in OUTAGE[:2]:
        out = json.loads(next((run_dir / "tasks" / tid / "turn_001").glob("*call_model/output.json")).read_text())
        assert out["raw_response"]["flowllm_route"]["provider"] == "backup"
