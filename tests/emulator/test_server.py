"""The emulator over HTTP: error shapes, determinism, statelessness, the command line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from flowllm.emulator import Emulator

SCRIPT = {"default": [{"text": "default"}], "tasks": {f"t{i}": [{"text": f"reply {i}"}] for i in range(8)}}
AUTH = {"authorization": "Bearer k"}


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(SCRIPT) as emulator:
        yield emulator


def anthropic_body(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": text}], **extra}


def post(
    emu: Emulator, path: str, body: Any, task: str | None = "t1", headers: dict[str, str] | None = None
) -> httpx2.Response:
    head = {**AUTH, **({"x-flowllm-task": task} if task else {}), **(headers or {})}
    return httpx2.post(emu.base_url + path, json=body, headers=head, timeout=10)


def test_error_shapes_follow_each_api(emu: Emulator) -> None:
    bad = {"model": "m", "messages": []}
    anthropic = post(emu, "/v1/messages", bad)
    assert anthropic.status_code == 400
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "invalid_request_error"
    chat = post(emu, "/v1/chat/completions", bad)
    assert chat.status_code == 400
    assert set(chat.json()["error"]) == {"message", "type", "param", "code"}
    unauthorized = httpx2.post(emu.base_url + "/v1/messages", json=anthropic_body(), timeout=10)
    assert unauthorized.status_code == 401
    both = post(emu, "/v1/messages", anthropic_body(), headers={"x-api-key": "k"})
    assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
    assert post(emu, "/v1/messages", "[not json").status_code == 400


def test_replies_are_deterministic_and_the_same_streamed(emu: Emulator) -> None:
    first = post(emu, "/v1/messages", anthropic_body()).json()
    again = post(emu, "/v1/messages", anthropic_body()).json()
    assert first == again
    assert first["content"] == [{"type": "text", "text": "reply 1"}]
    streamed = post(emu, "/v1/messages", anthropic_body(stream=True))
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[0]["message"]["id"] == first["id"]  # same id streamed or not
    assert streamed.text.startswith("event: message_start\n")
    different = post(emu, "/v1/messages", anthropic_body("other question")).json()
    assert different["id"] != first["id"]


def test_chat_stream_ends_with_usage_then_done(emu: Emulator) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text = post(emu, "/v1/chat/completions", body).text
    datas = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    last = json.loads(datas[-2])
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] > 0
    assert all(json.loads(d)["object"] == "chat.completion.chunk" for d in datas[:-1])


async def test_concurrent_tasks_get_their_own_replies(emu: Emulator) -> None:
    async with httpx2.AsyncClient(timeout=10) as client:

        async def ask(i: int) -> str:
            r = await client.post(
                emu.base_url + "/v1/messages",
                json=anthropic_body(),
                headers={**AUTH, "x-flowllm-task": f"t{i}"},
            )
            return str(r.json()["content"][0]["text"])

        replies = await asyncio.gather(*(ask(i) for i in range(8)))
    assert replies == [f"reply {i}" for i in range(8)]


def test_request_log_keeps_routing_but_no_key(emu: Emulator) -> None:
    post(emu, "/v1/messages", anthropic_body(), task="t3", headers={"x-flowllm-agent": "sub"})
    record = emu.requests[-1]
    assert (record.task_id, record.agent, record.turn, record.status) == ("t3", "sub", 1, 200)
    assert "Bearer" not in repr(record) and "k'" not in repr(record)


def test_two_emulators_get_different_free_ports() -> None:
    with Emulator(SCRIPT) as a, Emulator(SCRIPT) as b:
        assert a.port != b.port and a.port > 0


def test_command_line(tmp_path: Path) -> None:
    script = tmp_path / "s.yaml"
    script.write_text(yaml.safe_dump(SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowllm.emulator", "--script", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split()[3]
        reply = httpx2.post(
            url + "/v1/messages", json=anthropic_body(), headers={**AUTH, "x-flowllm-task": "t2"}, timeout=10
        )
        assert reply.json()["content"][0]["text"] == "reply 2"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_injected_faults_follow_the_schedule_and_are_logged() -> None:
    from flowllm.emulator.faults import FaultPlan

    faults = FaultPlan.parse(
        {"rules": [{"fault": "status", "status": 429, "retry_after_s": 1.5, "tasks": ["t1"], "attempts": [1, 2]}]}
    )
    with Emulator(SCRIPT, faults=faults) as emu:
        first = post(emu, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert first.status_code == 429
        assert first.headers["retry-after-ms"] == "1500" and first.headers["retry-after"] == "2"
        assert first.json()["error"]["type"] == "rate_limit_error"
        second = post(emu, "/v1/messages", anthropic_body())
        third = post(emu, "/v1/messages", anthropic_body())
        other = post(emu, "/v1/messages", anthropic_body(), task="t2")
        assert (second.status_code, third.status_code, other.status_code) == (429, 200, 200)
        log = [(r.task_id, r.attempt, r.status, r.fault) for r in emu.requests]
    assert log == [
        ("t1", 1, 429, "status:429"),
        ("t1", 2, 429, "status:429"),
        ("t1", 3, 200, None),
        ("t2", 1, 200, None),
    ]


def test_a_script_can_carry_its_faults_and_bad_ones_are_refused(tmp_path: Path) -> None:
    from flowllm.emulator import ScriptError
    from flowllm.emulator.script import Script

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SCRIPT, "faults": {"seed": 2, "rules": [{"fault": "reset", "rate": 0.5}]}}))
    with Emulator(path) as emu:
        assert emu.faults.seed == 2 and emu.faults.rules[0].fault == "reset"
    path.write_text(yaml.safe_dump({**SCRIPT, "faults": {"rules": [{"fault": "reset", "rate": 2}]}}))
    with pytest.raises(ScriptError, match="rate must be between 0 and 1"):
        Script.load(path)


def test_the_clients_turn_and_agent_choose_the_scripted_reply() -> None:
    script = {
        "tasks": {
            "t": [{"text": "one"}, {"text": "two"}, {"text": "three"}],
            "t/helper": [{"text": "helper one"}],
        }
    }
    with Emulator(script) as emulator:

        def text(headers: dict[str, str]) -> str:
            return post(emulator, "/v1/messages", anthropic_body(), "t", headers).json()["content"][0]["text"]

        # One user message, no assistant message: counted, that is turn 1; a compacted history says otherwise.
        assert text({}) == "one"
        assert text({"x-flowllm-turn": "3"}) == "three"
        assert text({"x-flowllm-turn": "nonsense"}) == "one"
        assert text({"x-flowllm-agent": "helper"}) == "helper one"
        assert text({"x-flowllm-agent": "main"}) == "one"
