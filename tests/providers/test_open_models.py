"""Open models as servers really serve them: the history carries what was executed, strict templates get
alternating roles and 9-character ids, a template's refusal fails fast, and each request is shaped for the
model that receives it."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from flowllm.config.provider_schema import HistoryConfig, WireConfig
from flowllm.core.interfaces import CallContext
from flowllm.core.types import Message, ModelResponse
from flowllm.engine import TurnContext
from flowllm.nodes.dispatch import DispatchTools
from flowllm.nodes.toolcalls import ParseToolCalls, RepairArguments
from flowllm.parsing import BadToolCall
from flowllm.providers import build_provider, open_provider
from flowllm.providers.base import BaseProvider
from flowllm.providers.errors import ProviderCallError
from flowllm.providers.wire.chat_history import BRIDGE_TEXT, alternate, is_portable, portable_id
from flowllm.providers.wire.models import CLAUDE_ADAPTIVE, OPENAI_REASONING_MODEL, rule_for, shape_request, traits_for

from .conftest import SYSTEM, TOOLS, make_cfg
from .test_wire_errors import http_server, read_request

TASK: Message = {"role": "user", "content": [{"type": "text", "text": "What is 17.5 * 2?"}]}
CUT = '{"expression": "17.5'  # a call cut by max_tokens


def chat_body(arguments: str, call_id: str = "call_0", reply_id: str = "chatcmpl-1") -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "tool-math-calculate", "arguments": arguments}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    return {"id": reply_id, "model": "m", "choices": [{"index": 0, "message": message, "finish_reason": "length"}]}


def provider(protocol: str, **overrides: Any) -> BaseProvider:
    return build_provider(make_cfg(protocol, tool_protocol="native", **overrides), base_url="http://127.0.0.1:9/v1")


async def next_history(response: ModelResponse) -> list[Message]:
    """The history after the turn, through the real parse, repair and dispatch nodes (no tool backend)."""
    ctx = TurnContext(task_id="t", turn=1)
    parsed = await ParseToolCalls().run(ctx, response, TOOLS)
    prepared = (await RepairArguments().run(ctx, parsed["tool_calls"]))["prepared_calls"]
    out = await DispatchTools().run(ctx, [TASK], response, prepared, parsed["bad_tool_calls"])
    return list(out["next_messages"])


def wire_arguments(protocol: str, request: dict[str, Any]) -> list[Any]:
    """The arguments each protocol's request carries for the assistant's calls, decoded."""
    if protocol == "openai_chat":
        calls = [c for m in request["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])]
        return [json.loads(c["function"]["arguments"]) for c in calls]
    if protocol == "openai_responses":
        return [json.loads(i["arguments"]) for i in request["input"] if i.get("type") == "function_call"]
    blocks = [b for m in request["messages"] if m["role"] == "assistant" for b in m["content"]]
    return [b["input"] for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]


# ----- the history holds what was executed ------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["openai_chat", "openai_responses", "anthropic"])
async def test_the_next_request_carries_the_repaired_arguments(protocol: str) -> None:
    chat = provider("openai_chat")
    history = await next_history(chat.normalize(chat_body(CUT)))
    request = provider(protocol).build_request(system=SYSTEM, messages=history, tools=TOOLS)
    assert wire_arguments(protocol, request) == [{"expression": "17.5"}]  # as executed, valid JSON


@pytest.mark.parametrize("protocol", ["openai_chat", "openai_responses", "anthropic"])
async def test_an_unrepairable_call_is_recorded_as_a_well_formed_object(protocol: str) -> None:
    chat = provider("openai_chat")
    history = await next_history(chat.normalize(chat_body("<<not json at all")))
    request = provider(protocol).build_request(system=SYSTEM, messages=history, tools=TOOLS)
    assert wire_arguments(protocol, request) == [{"invalid_arguments": "<<not json at all"}]
    results = history[-1]["content"]
    assert results[0]["type"] == "tool_result" and results[0]["is_error"] is True


async def test_clean_arguments_keep_the_models_own_text() -> None:
    chat = provider("openai_chat")
    history = await next_history(chat.normalize(chat_body('{"expression":  "2+2"}')))
    request = chat.build_request(system=SYSTEM, messages=history, tools=TOOLS)
    assistant = next(m for m in request["messages"] if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"expression":  "2+2"}'


async def test_an_unreadable_native_call_is_answered_as_text_not_by_a_dangling_id() -> None:
    chat = provider("openai_chat")
    response = chat.normalize(chat_body('{"a": 1}'))
    response.tool_calls[0].name = ""  # a call without a name: the parser reports it as bad
    ctx = TurnContext(task_id="t", turn=1)
    parsed = await ParseToolCalls().run(ctx, response, TOOLS)
    assert parsed["tool_calls"] == [] and isinstance(parsed["bad_tool_calls"][0], BadToolCall)
    out = await DispatchTools().run(ctx, [TASK], response, [], parsed["bad_tool_calls"])
    reply, results = out["next_messages"][1:]
    assert not [b for b in reply["content"] if b["type"] == "tool_use"]
    assert [b["type"] for b in results["content"]] == ["text"] and "could not be read" in results["content"][0]["text"]
    request = chat.build_request(system=SYSTEM, messages=out["next_messages"], tools=TOOLS)
    assert "tool" not in [m["role"] for m in request["messages"]]


# ----- strict templates: alternation and ids ----------------------------------------------------------------
def mistral_check(messages: list[dict[str, Any]]) -> None:
    """Mistral's template rule: after the system message, user and assistant alternate, tool results and
    assistant messages with tool calls not counted (raise_exception "roles must alternate" otherwise)."""
    index = 0
    for m in messages:
        if m["role"] == "system" or m["role"] == "tool" or m.get("tool_calls"):
            continue
        if (m["role"] == "user") != (index % 2 == 0):
            raise AssertionError("roles must alternate user/assistant/user/assistant/...")
        index += 1


async def summary_turn_history(chat: BaseProvider) -> list[Message]:
    history = await next_history(chat.normalize(chat_body('{"expression": "2+2"}')))
    last = history[-1]
    summary: Message = {**last, "content": [*last["content"], {"type": "text", "text": "Give your final answer."}]}
    return [*history[:-1], summary, {"role": "user", "content": [{"type": "text", "text": "A hook's note."}]}]


async def test_alternating_roles_bridge_tool_results_and_join_user_messages() -> None:
    strict = provider("openai_chat", history=HistoryConfig(alternate_roles=True))
    messages = strict.build_request(system=SYSTEM, messages=await summary_turn_history(strict), tools=[])["messages"]
    mistral_check(messages)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert messages[4]["content"] == BRIDGE_TEXT
    assert messages[5]["content"] == "Give your final answer.\n\nA hook's note."
    # The default for a model nobody declared strict: the conversation as it is.
    free = provider("openai_chat")
    plain = free.build_request(system=SYSTEM, messages=await summary_turn_history(free), tools=[])["messages"]
    with pytest.raises(AssertionError, match="alternate"):
        mistral_check(plain)
    # A Mistral model gets it without being told.
    mistral = provider("openai_chat", model="mistralai/Mistral-Nemo-Instruct-2407")
    mistral_check(
        mistral.build_request(system=SYSTEM, messages=await summary_turn_history(mistral), tools=[])["messages"]
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_portable_ids_are_nine_alphanumerics_mapped_from_the_servers_id(stream: bool) -> None:
    chat = provider("openai_chat", history=HistoryConfig(portable_ids=True))
    server_id = "Qh8JkYvJ2kCq0bZlN3yX5mT9aW4eR7uP"  # llama.cpp's 32-character id
    body = chat_body('{"expression": "2+2"}', call_id=server_id)
    if stream:
        message = body["choices"][0]["message"]
        events = [
            {"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", **message}}]},
            {"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ]
        events[0]["choices"][0]["delta"]["tool_calls"] = [{"index": 0, **message["tool_calls"][0]}]
        raw: dict[str, Any] = {"stream": True, "events": events}
    else:
        raw = body
    response = chat.normalize(raw)
    call_id = response.tool_calls[0].id
    assert is_portable(call_id) and call_id != server_id
    assert chat.normalize(raw).tool_calls[0].id == call_id  # the same reply, the same id (replay reads alike)
    block = next(b for b in response.content_blocks if b["type"] == "tool_use")
    assert block["id"] == call_id and block["server_id"] == server_id
    request = chat.build_request(system=SYSTEM, messages=await next_history(response), tools=TOOLS)
    assistant = next(m for m in request["messages"] if m["role"] == "assistant")
    tool = next(m for m in request["messages"] if m["role"] == "tool")
    assert assistant["tool_calls"][0]["id"] == tool["tool_call_id"] == call_id
    # Without the setting the server's id is kept; a missing id is always filled with a portable one.
    assert provider("openai_chat").normalize(body).tool_calls[0].id == server_id
    assert is_portable(provider("openai_chat").normalize(chat_body("{}", call_id="")).tool_calls[0].id)


# ----- a server's "I could not read your request" is not retried ----------------------------------------------
@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (500, "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101]", "bad_request"),
        (500, "Jinja Exception: After the optional system message, conversation roles must alternate", "bad_request"),
        (500, "\n------------\nWhile executing CallExpression at line 55, column 32 in source:\n...", "bad_request"),
        (500, "failed to get logits", "server"),
        # The reply, not the request: the server could not read what its model wrote in the family's format.
        (500, "The model produced output that does not match the expected peg-native format", "unparsed_reply"),
    ],
)
async def test_llama_cpp_template_and_parse_failures_fail_fast(status: int, message: str, kind: str) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = json.dumps({"error": {"code": status, "message": message, "type": "server_error"}}).encode()
        head = f"HTTP/1.1 {status} Internal Server Error\r\nContent-Type: application/json\r\n"
        writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    async with http_server(answer) as base:
        chat = build_provider(make_cfg("openai_chat"), base_url=base, api_key="k")
        try:
            request = chat.build_request(system=SYSTEM, messages=[TASK], tools=[])
            with pytest.raises(ProviderCallError) as info:
                await chat.send(request, context=CallContext("t", 1))
        finally:
            await chat.aclose()
    assert info.value.kind == kind and info.value.status == status
    assert info.value.retryable is (kind == "server")
    assert message.strip().splitlines()[0] in str(info.value)


# ----- request shaping by model family ----------------------------------------------------------------------
def test_the_model_table() -> None:
    for model in ("o1", "o3-mini", "o4-mini", "gpt-5", "gpt-5-mini", "openai/o3"):
        assert traits_for(model).reasoning, model
    for model in ("gpt-4o", "gpt-5-chat-latest", "o3x", "local-model"):
        assert not traits_for(model).reasoning, model
    assert traits_for("claude-sonnet-4-5").adaptive_thinking is False
    assert traits_for("claude-opus-4-5-20251101").adaptive_thinking is False
    assert traits_for("claude-3-7-sonnet-latest").adaptive_thinking is False
    assert traits_for("claude-opus-4-6").adaptive_thinking is True
    assert traits_for("MiniMax-M2").adaptive_thinking is None
    assert traits_for("mistral-small-latest").alternate_roles and traits_for("devstral-small").portable_ids
    assert traits_for("google/gemma-3-27b-it").alternate_roles and not traits_for("qwen3-8b").alternate_roles


def test_a_reasoning_model_on_chat_gets_a_request_its_api_accepts() -> None:
    o3 = provider("openai_chat", model="o3", temperature=0.0, extra_body={"top_p": 0.9})
    request = o3.build_request(system=SYSTEM, messages=[TASK], tools=TOOLS)
    assert "temperature" not in request and "top_p" not in request and "max_tokens" not in request
    assert request["max_completion_tokens"] == 4096
    notes = o3.shaping_notes()
    assert len(notes) == 3 and all("'o3'" not in n and "(o3)" in n for n in notes)
    # gpt-4o keeps its temperature and max_tokens.
    plain = provider("openai_chat", model="gpt-4o", temperature=0.0).build_request(system=SYSTEM, messages=[], tools=[])
    assert plain["temperature"] == 0.0 and plain["max_tokens"] == 4096


def test_gpt5_on_responses_takes_no_temperature() -> None:
    gpt5 = provider("openai_responses", model="gpt-5", temperature=0.2)
    assert "temperature" not in gpt5.build_request(system=SYSTEM, messages=[TASK], tools=[])
    assert (
        provider("openai_responses", model="gpt-4.1", temperature=0.2).build_request(
            system=SYSTEM, messages=[], tools=[]
        )["temperature"]
        == 0.2
    )


def test_adaptive_thinking_only_where_supported() -> None:
    old = provider("anthropic", model="claude-sonnet-4-5", thinking="adaptive", temperature=0.5)
    request = old.build_request(system=SYSTEM, messages=[TASK], tools=[])
    assert request["thinking"] == {"type": "enabled", "budget_tokens": 2000} and request["max_tokens"] > 2000
    assert "temperature" not in request
    new = provider("anthropic", model="claude-opus-4-6", thinking="adaptive")
    assert new.build_request(system=SYSTEM, messages=[TASK], tools=[])["thinking"] == {"type": "adaptive"}
    assert new.shaping_notes() == []


@pytest.mark.parametrize("model", ["claude-opus-4-7", "claude-opus-4-8", "claude-sonnet-5"])
def test_enabled_thinking_goes_adaptive_to_models_that_refuse_it(model: str) -> None:
    thinking = provider("anthropic", model=model, thinking="enabled", extra_body={"top_k": 40})
    request = thinking.build_request(system=SYSTEM, messages=[TASK], tools=[])
    assert request["thinking"] == {"type": "adaptive"} and request["output_config"] == {"effort": "low"}
    assert "top_k" not in request
    notes = thinking.shaping_notes()
    assert len(notes) == 2 and "sent as adaptive, output_config.effort=low" in notes[0] and "top_k" in notes[1]
    # Without thinking the configured temperature is what the model refuses.
    plain = provider("anthropic", model=model, temperature=0.0)
    assert "temperature" not in plain.build_request(system=SYSTEM, messages=[TASK], tools=[])
    assert plain.shaping_notes() == [
        f"provider 'offline' ({model}): request field 'temperature' dropped: Claude 4.7 and later take no temperature"
    ]


def test_the_effort_follows_the_budget_and_a_set_effort_is_kept() -> None:
    def effort(budget: int, request: dict[str, Any] | None = None) -> str:
        thinking = {"type": "enabled", "budget_tokens": budget}
        shaped = shape_request("anthropic", "claude-opus-4-7", {"thinking": thinking, **(request or {})})[0]
        return str(shaped["output_config"]["effort"])

    assert [effort(b) for b in (1024, 2048, 8000, 16000, 16001, 64000)] == ["low"] * 2 + ["medium"] * 2 + ["high"] * 2
    assert effort(64000, {"output_config": {"effort": "max"}}) == "max"  # provider.extra_body wins


def test_models_newer_than_the_table_follow_their_family() -> None:
    for model in ("claude-opus-9", "claude-sonnet-6-1-20290101", "claude-newname-7", "claude-mythos-preview"):
        assert rule_for(model) is CLAUDE_ADAPTIVE, model
    for model in ("gpt-7", "gpt-6.3-sol", "o9-mini", "openai/gpt-8-pro"):
        assert rule_for(model) is OPENAI_REASONING_MODEL, model
    for model in ("gpt-oss-120b", "qwen3-8b", "MiniMax-M2", "flowllm-emulator", "o3x"):
        assert rule_for(model) is None, model


def test_thinking_is_dropped_where_the_model_has_none() -> None:
    old = provider("anthropic", model="claude-3-5-haiku-latest", thinking="enabled")
    assert "thinking" not in old.build_request(system=SYSTEM, messages=[TASK], tools=[])
    chat = provider("openai_chat", model="gpt-4.1", thinking="enabled", temperature=0.3)
    request = chat.build_request(system=SYSTEM, messages=[TASK], tools=[])
    assert "reasoning_effort" not in request and request["temperature"] == 0.3
    responses = provider("openai_responses", model="gpt-4o", thinking="enabled")
    request = responses.build_request(system=SYSTEM, messages=[TASK], tools=[])
    assert "reasoning" not in request and "include" not in request
    assert responses.shaping_notes() == [
        "provider 'offline' (gpt-4o): request field 'reasoning' dropped: OpenAI models without reasoning take no "
        "reasoning effort"
    ]


def test_chat_sends_metadata_only_with_store() -> None:
    without = provider("openai_chat", wire=WireConfig(metadata={"run": "r1"}))
    request = without.build_request(system=SYSTEM, messages=[TASK], tools=[])
    assert "metadata" not in request and "store" not in request
    assert any("store" in n for n in without.shaping_notes())
    stored = provider("openai_chat", wire=WireConfig(metadata={"run": "r1"}, store=True))
    request = stored.build_request(system=SYSTEM, messages=[TASK], tools=[])
    assert request["metadata"] == {"run": "r1"} and request["store"] is True


@pytest.mark.parametrize(
    ("protocol", "model", "thinking", "fields"),
    [
        ("openai_chat", "o3", "disabled", ("temperature", "max_tokens")),
        ("anthropic", "claude-opus-4-7", "enabled", ("thinking", "top_p")),
    ],
)
async def test_each_change_is_said_once_in_the_log(
    tmp_path, caplog: pytest.LogCaptureFixture, protocol: str, model: str, thinking: str, fields: tuple[str, str]
) -> None:
    script = tmp_path / "script.yaml"
    script.write_text('default:\n  - {text: "ok"}\n')
    cfg = make_cfg(protocol, model=model, thinking=thinking, temperature=0.0, emulator_script=str(script))
    cfg.extra_body = {"top_p": 0.9} if protocol == "anthropic" else {}
    with caplog.at_level(logging.WARNING, logger="flowllm.providers.factory"):
        async with open_provider(cfg) as opened:
            for turn in (1, 2):
                request = opened.build_request(system=SYSTEM, messages=[TASK], tools=[])
                await opened.send(request, context=CallContext("t", turn))
    said = [r.getMessage() for r in caplog.records if r.name == "flowllm.providers.factory"]
    assert len(said) == 2 and all(any(f"'{field}'" in s for s in said) for field in fields)


def test_alternation_keeps_the_content_format_and_ids_stay_apart() -> None:
    parts = [{"type": "text", "text": "Q"}]
    wire = [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": [], "tool_calls": [{"id": "a"}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "user", "content": [{"type": "text", "text": "Answer."}]},
        {"role": "user", "content": "Now."},
    ]
    out = alternate(wire)
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "assistant", "user"]
    assert out[3]["content"] == [{"type": "text", "text": BRIDGE_TEXT}]
    assert out[4]["content"] == [{"type": "text", "text": "Answer."}, {"type": "text", "text": "Now."}]
    assert alternate(wire[:1]) == wire[:1]  # nothing to do: unchanged
    # Two calls with the same server id (servers that number calls per reply) get different portable ids.
    ids = {portable_id("call_0", response_id="r", index=i) for i in range(2)}
    assert len(ids) == 2 and all(is_portable(i) for i in ids)
