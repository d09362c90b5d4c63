"""flowllm's real provider path against llama-cpp-python's server (a server nobody here wrote).

The model is SmolLM2-135M-Instruct: it answers wrongly and writes no tool call on its own, so calls are forced
with the server's own options (``tool_choice`` for the native protocol, a ``grammar`` for the text one). Every
assertion is about the protocol: the request was accepted, the reply is complete, usage is there or marked
estimated, calls parse, errors are clear. Never about accuracy.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flowllm.core.interfaces import CallContext
from flowllm.core.types import Message, ModelResponse
from flowllm.parsing import parse_tool_calls
from flowllm.providers.base import BaseProvider
from flowllm.providers.errors import ProviderCallError

from .conftest import run_flowllm
from .server import LlamaServer, start_server

SYSTEM = [{"type": "text", "text": "You are a helpful assistant."}]
TOOLS = [
    {
        "server": "math",
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    }
]


def force_native(server: str) -> str:
    """The override that makes the server call ``<server>-calculate`` (its tool_choice option)."""
    return f"+provider.extra_body.tool_choice={{type: function, function: {{name: {server}-calculate}}}}"


def grammar(server: str) -> str:
    """A GBNF grammar that makes the model write the text protocol's markup; it only chooses the digits."""
    return (
        f'root ::= "<use_mcp_tool>\\n<server_name>{server}</server_name>\\n<tool_name>calculate</tool_name>\\n'
        '<arguments>\\n{\\"expression\\": \\"" [1-9] "+" [1-9] "\\"}\\n</arguments>\\n</use_mcp_tool>"'
    )


FORCE_NATIVE = force_native("math")  # the provider-level cases offer TOOLS (server "math")
GRAMMAR = grammar("math")
SUMMARY = "You have used every turn: give your final answer now."
Connect = Callable[..., BaseProvider]


def user(text: str) -> Message:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


async def ask(provider: BaseProvider, messages: list[Message], tools: list[Any] | None = None) -> ModelResponse:
    request = provider.build_request(system=SYSTEM, messages=messages, tools=tools or [])
    raw = await provider.send(request, context=CallContext("compat", 1))
    return provider.normalize(raw)


def assert_complete(response: ModelResponse) -> None:
    assert response.text or response.tool_calls
    assert response.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


# ----- single replies -------------------------------------------------------------------------------------
async def test_plain_reply_with_usage(connect: Connect) -> None:
    response = await ask(connect("provider.stream=false", "provider.max_tokens=48"), [user("Say hello.")])
    assert_complete(response)
    assert not response.usage.estimated  # usage present: the server's own counts


async def test_streamed_reply_complete(connect: Connect) -> None:
    response = await ask(connect("provider.stream=true", "provider.max_tokens=48"), [user("Say hello.")])
    assert_complete(response)


async def test_streamed_usage_absent_is_estimated_on_the_prompt(connect: Connect) -> None:
    provider = connect("provider.stream=true", "provider.max_tokens=48", "provider.wire.stream_usage=false")
    response = await ask(provider, [user("Say hello.")])
    assert_complete(response)
    assert response.usage.estimated  # no usage in the stream: an estimate, marked as such
    prompt = len(SYSTEM[0]["text"]) + len("Say hello.")
    assert response.usage.input_tokens == -(-prompt // 4)


# ----- tool calls, forced ---------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_native_call_forced_with_tool_choice(connect: Connect, stream: bool) -> None:
    provider = connect(f"provider.stream={stream}", "provider.tool_protocol=native", FORCE_NATIVE)
    response = await ask(provider, [user("What is 2+3?")], TOOLS)
    assert [c.name for c in response.tool_calls] == ["math-calculate"]
    assert isinstance(json.loads(response.tool_calls[0].arguments), dict)
    assert response.tool_calls[0].id


@pytest.mark.parametrize("stream", [False, True])
async def test_text_call_forced_with_grammar(connect: Connect, stream: bool) -> None:
    provider = connect(f"provider.stream={stream}", "provider.tool_protocol=xml", "provider.max_tokens=96")
    provider.cfg.extra_body = {"grammar": GRAMMAR}
    response = await ask(provider, [user("What is 2+3?")])
    calls = parse_tool_calls(response.text)
    assert [(c.server, c.name) for c in calls.calls] == [("math", "calculate")]


# ----- multi-turn loops -----------------------------------------------------------------------------------
def native_history(response: ModelResponse, results: int, summary: bool) -> list[Message]:
    """The task, the model's (real) call message, ``results`` tool results, optionally the summary prompt."""
    call = next(b for b in response.content_blocks if b.get("type") == "tool_use")
    calls = [call] + [{**call, "id": f"{call['id']}-{i}"} for i in range(1, results)]
    content: list[Any] = [
        {"type": "tool_result", "tool_use_id": c["id"], "content": [{"type": "text", "text": str(5 + i)}]}
        for i, c in enumerate(calls)
    ]
    if summary:
        content.append({"type": "text", "text": SUMMARY})
    assistant = [b for b in response.content_blocks if b.get("type") != "tool_use"] + calls
    return [user("What is 2+3?"), {"role": "assistant", "content": assistant}, {"role": "user", "content": content}]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("results", "summary"), [(1, False), (3, False), (2, True)])
async def test_native_loop_turn_two(connect: Connect, stream: bool, results: int, summary: bool) -> None:
    forced = connect("provider.stream=false", "provider.tool_protocol=native", FORCE_NATIVE)
    first = await ask(forced, [user("What is 2+3?")], TOOLS)
    follow = connect(f"provider.stream={stream}", "provider.tool_protocol=native", "provider.max_tokens=48")
    # Turn 2 (an assistant message with calls and no text, then tool results): accepted and complete.
    response = await ask(follow, native_history(first, results, summary), None if summary else TOOLS)
    assert_complete(response)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("results", "summary"), [(1, False), (2, False), (2, True)])
async def test_text_loop_turn_two(connect: Connect, stream: bool, results: int, summary: bool) -> None:
    provider = connect(f"provider.stream={stream}", "provider.max_tokens=48")
    blocks: list[Any] = [{"type": "text", "text": f"<tool_result>{5 + i}</tool_result>"} for i in range(results)]
    if summary:
        blocks.append({"type": "text", "text": SUMMARY})
    history = [
        user("What is 2+3?"),
        {"role": "assistant", "content": [{"type": "text", "text": "<use_mcp_tool>...</use_mcp_tool>"}]},
        {"role": "user", "content": blocks},
    ]
    assert_complete(await ask(provider, history))


# ----- concurrency ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("concurrency", [1, 4])
async def test_concurrent_requests(connect: Connect, stream: bool, concurrency: int) -> None:
    """One provider, ``concurrency`` requests at once. The server (one slot, interrupt_requests on by default)
    runs one at a time and ends a running stream when the next arrives: every request either completes or
    fails as a truncated stream whose error names the cause and the setting."""
    provider = connect(f"provider.stream={stream}", "provider.max_tokens=32")
    outcomes = await asyncio.gather(
        *(ask(provider, [user(f"Count to {i + 3}.")]) for i in range(concurrency)), return_exceptions=True
    )
    for outcome in outcomes:
        if isinstance(outcome, ProviderCallError):
            assert stream and concurrency > 1, f"failed without concurrency: {outcome}"
            assert outcome.kind == "truncated" and "provider.rate_limit.max_in_flight" in str(outcome)
        else:
            assert isinstance(outcome, ModelResponse)
            assert_complete(outcome)
    if not stream or concurrency == 1:
        assert all(isinstance(o, ModelResponse) for o in outcomes)


# ----- failures -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_context_overflow_is_a_clear_context_length_error(connect: Connect, stream: bool) -> None:
    provider = connect(f"provider.stream={stream}")
    with pytest.raises(ProviderCallError) as info:
        await ask(provider, [user("word " * 5000)])  # far past the default n_ctx of 2048
    if stream and info.value.kind == "truncated":
        # The server checks the prompt only once the stream has begun, and then ends it without a word.
        assert "no event at all" in str(info.value) and "context" in str(info.value)
    else:
        assert info.value.kind == "context_length" and not info.value.retryable, str(info.value)


async def test_server_killed_mid_run(connect: Connect, log_dir: Path) -> None:
    """A second server, killed (SIGKILL) while a long streamed reply is being read."""
    doomed: LlamaServer = await asyncio.to_thread(start_server, log_dir)
    provider = connect("provider.stream=true", "provider.max_tokens=1024", server=doomed)
    call = asyncio.create_task(ask(provider, [user("Write a very long story about a river.")]))
    try:
        # Kill it once the reply has started: uvicorn logs the request when the stream's headers go out.
        for _ in range(2400):  # a hang guard only
            if call.done() or "POST /v1/chat/completions" in doomed.log_path.read_text(errors="replace"):
                break
            await asyncio.sleep(0.25)
        await asyncio.to_thread(doomed.kill)
        with pytest.raises(ProviderCallError) as info:
            await asyncio.wait_for(call, timeout=120)
    finally:
        doomed.kill()
    assert info.value.kind in ("connection", "truncated") and info.value.retryable
    assert doomed.base_url in str(info.value) or info.value.kind == "truncated", str(info.value)


# ----- the command line, as a user types it ---------------------------------------------------------------
def assert_every_task_completed(run_dir: Path, proc: Any) -> list[dict[str, Any]]:
    results = [json.loads(p.read_text()) for p in sorted(run_dir.glob("tasks/*/result.json"))]
    assert results, f"no task results (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    failed = [(r["task_id"], r.get("error")) for r in results if r.get("status") != "completed"]
    assert not failed, failed
    return results


def test_cli_defaults(llama: LlamaServer, tmp_path: Path) -> None:
    """The issue's "done when": provider=local at every other default (streamed, text protocol, 4 at once)."""
    run_dir = tmp_path / "run"
    proc = run_flowllm(run_dir, "provider=local", f"provider.base_url={llama.base_url}", "provider.model=smollm2")
    assert_every_task_completed(run_dir, proc)


@pytest.mark.parametrize("stream", [True, False])
def test_cli_defaults_one_request_at_a_time(llama: LlamaServer, tmp_path: Path, stream: bool) -> None:
    """The same, one task at a time: what provider.rate_limit.max_in_flight=1 gives a one-slot server."""
    run_dir = tmp_path / "run"
    overrides = [f"provider.base_url={llama.base_url}", "provider.model=smollm2", f"provider.stream={stream}"]
    proc = run_flowllm(run_dir, "provider=local", *overrides, "experiment.max_concurrent=1")
    assert_every_task_completed(run_dir, proc)


@pytest.mark.parametrize("stream", [False, True])
def test_cli_native_loop_and_summary_turn(llama: LlamaServer, tmp_path: Path, stream: bool) -> None:
    """Forced native calls every turn: the loop runs to agent.max_turns, then the summary turn (no tools)."""
    run_dir = tmp_path / "run"
    proc = run_flowllm(
        run_dir,
        "provider=local",
        f"provider.base_url={llama.base_url}",
        "provider.model=smollm2",
        f"provider.stream={stream}",
        "provider.tool_protocol=native",
        "provider.max_tokens=64",
        force_native("tool-math"),  # the default tool servers: tool-math, tool-python, tool-files
        "agent.max_turns=2",
        "experiment.max_concurrent=1",
        "dataset.limit=2",
    )
    results = assert_every_task_completed(run_dir, proc)
    assert all(r["stop"] == "max_turns" and r["turns"] == 3 and r["tool_calls"] >= 2 for r in results), results


@pytest.mark.parametrize("stream", [False, True])
def test_cli_text_loop_and_summary_turn(llama: LlamaServer, tmp_path: Path, stream: bool) -> None:
    """Forced text-protocol calls (the grammar, from the environment): several turns, then the summary."""
    run_dir = tmp_path / "run"
    proc = run_flowllm(
        run_dir,
        "provider=local",
        f"provider.base_url={llama.base_url}",
        "provider.model=smollm2",
        f"provider.stream={stream}",
        "provider.max_tokens=96",
        "+provider.extra_body.grammar=${oc.env:FLOWLLM_COMPAT_GRAMMAR}",
        "agent.max_turns=2",
        "experiment.max_concurrent=1",
        "dataset.limit=2",
        env={"FLOWLLM_COMPAT_GRAMMAR": grammar("tool-math")},
    )
    results = assert_every_task_completed(run_dir, proc)
    assert all(r["stop"] == "max_turns" and r["tool_calls"] >= 2 for r in results), results
