"""Whole conversations through the real SDKs against the emulator, for every protocol, streamed and not."""

from __future__ import annotations

from typing import Any

import pytest

from flowllm.core.interfaces import CallContext
from flowllm.core.types import Message, ModelResponse
from flowllm.providers import ProviderCallError
from flowllm.providers.base import BaseProvider

from .conftest import PROTOCOLS, SYSTEM, TOOLS

RESULTS = {"tool-math-calculate": "4", "tool-files-read_file": "hello"}


def tool_results(response: ModelResponse, turn: int) -> Message:
    """The user message the engine would append: one tool_result per native call."""
    blocks: list[Any] = []
    for call in response.tool_calls:
        text = RESULTS[call.name] if turn == 1 else f"{RESULTS[call.name]}{turn}"
        blocks.append(
            {
                "type": "tool_result",
                "tool_use_id": call.id,
                "content": [{"type": "text", "text": text}],
                "is_error": False,
            }
        )
    return {"role": "user", "content": blocks}


async def converse(provider: BaseProvider, task: str, turns: int) -> list[ModelResponse]:
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "What is (2+2)*10?"}]}]
    replies = []
    for turn in range(1, turns + 1):
        request = provider.build_request(system=SYSTEM, messages=messages, tools=TOOLS)
        raw = await provider.send(request, context=CallContext(task_id=task, turn=turn))
        reply = provider.normalize(raw)
        replies.append(reply)
        messages.append(reply.to_message())
        if reply.tool_calls:
            messages.append(tool_results(reply, turn))
    return replies


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_three_turn_thinking_tool_loop(connect: Any, protocol: str) -> None:
    provider = connect(protocol, tool_protocol="native", thinking="enabled")
    first, second, third = await converse(provider, "calc", 3)

    assert first.text == "Let me add."
    assert first.stop_reason == "tool_use"
    assert [c.name for c in first.tool_calls] == ["tool-math-calculate"]
    assert first.tool_calls[0].arguments == '{"expression": "2+2"}'
    assert first.thinking == "I need to add first."
    # Turn 2 saw the result of turn 1 through the template, and made two parallel calls.
    assert [c.arguments for c in second.tool_calls] == ['{"expression": "4*10"}', '{"path": "notes.txt"}']
    assert second.text == ""
    # Turn 3 saw every tool result in order: the emulator accepted the thinking / reasoning of turns 1 and 2
    # as sent back (it rejects a missing or altered one with a 400).
    assert third.text == "\\boxed{42} (hello2)"
    assert third.stop_reason == "end_turn"
    assert third.thinking == "Both results are in."
    assert third.usage.reasoning_tokens > 0
    assert third.usage.output_tokens >= third.usage.reasoning_tokens


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_streamed_and_plain_replies_are_identical(connect: Any, protocol: str) -> None:
    plain = await converse(connect(protocol, tool_protocol="native", thinking="enabled"), "calc", 3)
    streamed = await converse(connect(protocol, tool_protocol="native", thinking="enabled", stream=True), "calc", 3)
    assert [r.to_dict() for r in streamed] == [r.to_dict() for r in plain]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_xml_protocol_sends_no_tool_schemas_and_reads_text_results(connect: Any, protocol: str) -> None:
    provider = connect(protocol, tool_protocol="xml")
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]
    request = provider.build_request(system=SYSTEM, messages=messages, tools=TOOLS)
    assert "tools" not in request
    first = provider.normalize(await provider.send(request, context=CallContext("xml", 1)))
    assert "<use_mcp_tool>" in first.text and not first.tool_calls
    messages.append(first.to_message())
    result = '<tool_result server="tool-math" tool="calculate">\n4 &lt;/tool_result> ok\n</tool_result>'
    messages.append({"role": "user", "content": [{"type": "text", "text": result}]})
    request = provider.build_request(system=SYSTEM, messages=messages, tools=TOOLS)
    second = provider.normalize(await provider.send(request, context=CallContext("xml", 2)))
    # The escaped closing tag inside the content comes back unescaped.
    assert second.text == "The answer is \\boxed{4 </tool_result> ok}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_unknown_task_and_turns_past_the_script_use_default(connect: Any, protocol: str) -> None:
    provider = connect(protocol)
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    request = provider.build_request(system=SYSTEM, messages=messages, tools=[])
    reply = provider.normalize(await provider.send(request, context=CallContext("no-such-task", 1)))
    assert reply.text == "I could not solve this task. \\boxed{none}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_dropping_thinking_from_the_history_is_refused(connect: Any, protocol: str) -> None:
    provider = connect(protocol, tool_protocol="native", thinking="enabled")
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    first = provider.normalize(
        await provider.send(
            provider.build_request(system=SYSTEM, messages=messages, tools=TOOLS),
            context=CallContext("calc", 1),
        )
    )
    assistant = first.to_message()
    assistant["content"] = [b for b in assistant["content"] if b["type"] not in ("thinking", "reasoning")]
    messages += [assistant, tool_results(first, 1)]
    request = provider.build_request(system=SYSTEM, messages=messages, tools=TOOLS)
    if protocol == "openai_chat":
        # Chat has no thinking round trip to enforce: the call goes through.
        await provider.send(request, context=CallContext("calc", 2))
        return
    with pytest.raises(ProviderCallError) as info:
        await provider.send(request, context=CallContext("calc", 2))
    assert info.value.kind == "bad_request" and info.value.status == 400
    assert not info.value.retryable
    assert "thinking" in info.value.message or "reasoning" in info.value.message


async def test_altered_thinking_signature_is_refused(connect: Any) -> None:
    provider = connect("anthropic", tool_protocol="native", thinking="enabled")
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    first = provider.normalize(
        await provider.send(
            provider.build_request(system=SYSTEM, messages=messages, tools=TOOLS),
            context=CallContext("calc", 1),
        )
    )
    assistant = first.to_message()
    assistant["content"][0]["thinking"] = "I need to subtract first."  # edited text, old signature
    messages += [assistant, tool_results(first, 1)]
    with pytest.raises(ProviderCallError, match="signature"):
        await provider.send(
            provider.build_request(system=SYSTEM, messages=messages, tools=TOOLS),
            context=CallContext("calc", 2),
        )


async def test_anthropic_cache_breakpoints_write_then_read(connect: Any) -> None:
    provider = connect("anthropic")
    # 5,600 characters: 1,400 tokens, past the 1,024-token minimum a prefix needs to be cached at all.
    system = [{"type": "text", "text": "You are a careful assistant." * 200, "cache_control": {"type": "ephemeral"}}]
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]
    first = provider.normalize(
        await provider.send(
            provider.build_request(system=system, messages=messages, tools=[]), context=CallContext("xml", 1)
        )
    )
    assert first.usage.cache_write_tokens == 1400  # ceil(5,600 chars / 4): the prefix up to the breakpoint
    assert first.usage.cache_read_tokens == 0
    # input_tokens counts every prompt token, the cached prefix included (never twice).
    assert first.usage.input_tokens == 1403
    messages += [first.to_message(), {"role": "user", "content": [{"type": "text", "text": "go on"}]}]
    second = provider.normalize(
        await provider.send(
            provider.build_request(system=system, messages=messages, tools=[]), context=CallContext("xml", 2)
        )
    )
    assert second.usage.cache_read_tokens == 1400 and second.usage.cache_write_tokens == 0
    assert second.usage.input_tokens > first.usage.input_tokens


@pytest.mark.parametrize("protocol", ["openai_chat", "openai_responses"])
async def test_openai_reports_the_prefix_seen_before(connect: Any, protocol: str) -> None:
    provider = connect(protocol)
    # 28 + 5,000 characters: 1,257 tokens, past the 1,024 OpenAI caches from.
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "x" * 5000}]}]
    first = provider.normalize(
        await provider.send(
            provider.build_request(system=SYSTEM, messages=messages, tools=[]), context=CallContext("xml", 1)
        )
    )
    assert first.usage.cache_read_tokens == 0
    messages += [first.to_message(), {"role": "user", "content": [{"type": "text", "text": "y" * 400}]}]
    second = provider.normalize(
        await provider.send(
            provider.build_request(system=SYSTEM, messages=messages, tools=[]), context=CallContext("xml", 2)
        )
    )
    # The first prompt is the second's prefix: 1,257 tokens seen before, reported as 1,024 + 1 x 128.
    assert second.usage.cache_read_tokens == 1152
    assert second.usage.cache_write_tokens == 0


async def test_same_conversation_reports_same_usage_on_every_protocol(connect: Any) -> None:
    usages = []
    for protocol in PROTOCOLS:
        replies = await converse(connect(protocol, tool_protocol="native", cache=False), "calc", 3)
        usages.append([(r.usage.input_tokens, r.usage.output_tokens) for r in replies])
    assert usages[0] == usages[1] == usages[2]


async def test_task_and_agent_headers_reach_the_server(connect: Any, emulator: Any) -> None:
    provider = connect("openai_chat")
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    await provider.send(
        provider.build_request(system=SYSTEM, messages=messages, tools=[]),
        context=CallContext("header-task", 1, agent="browser"),
    )
    record = emulator.requests[-1]
    assert (record.task_id, record.agent, record.protocol) == ("header-task", "browser", "openai_chat")
    assert record.auth == "bearer"


async def test_x_api_key_auth_sends_the_key_once(connect: Any, emulator: Any) -> None:
    provider = connect("anthropic", auth="x-api-key")
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    await provider.send(
        provider.build_request(system=SYSTEM, messages=messages, tools=[]), context=CallContext("xml", 1)
    )
    assert emulator.requests[-1].auth == "x-api-key"  # "both" would have been refused with a 400
