"""Normalisation of recorded raw responses (fixtures/), and the usage arithmetic of each protocol."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flowllm.core.types import USAGE_COUNTS, ModelResponse, Usage
from flowllm.engine.recorder import unmasked_record
from flowllm.providers import ProviderCallError, ProviderResponseError, build_provider
from flowllm.providers.base import BaseProvider

from .conftest import make_cfg

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def provider(protocol: str) -> BaseProvider:
    # Never sends anything: normalize is pure.
    return build_provider(make_cfg(protocol), base_url="http://127.0.0.1:9", api_key="unused")


def test_anthropic_thinking_tool_use() -> None:
    reply = provider("anthropic").normalize(load("anthropic_thinking_tool_use.json"))
    assert reply.text == "I'll check the attachments."
    assert reply.stop_reason == "tool_use"
    assert reply.thinking == "The user wants the file size. I will list the files."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("toolu_01XyZ", "tool-files-list_files", {"path": ".", "recursive": False})
    ]
    # The history keeps the thinking block with its signature, first, for the next turn.
    assert reply.to_message()["content"][0] == {
        "type": "thinking",
        "thinking": "The user wants the file size. I will list the files.",
        "signature": "EqQBCkYIBxgCKkBsig==",
    }
    # input_tokens excludes cache reads and writes on the wire; ours includes them, each counted once.
    assert reply.usage == Usage(
        input_tokens=95 + 1200 + 3000,
        output_tokens=503,
        cache_read_tokens=3000,
        cache_write_tokens=1200,
        reasoning_tokens=13,
    )


def test_anthropic_stream_with_empty_and_redacted_thinking_and_cumulative_usage() -> None:
    reply = provider("anthropic").normalize(load("anthropic_stream_redacted.json"))
    blocks = reply.content_blocks
    assert blocks[0] == {"type": "thinking", "thinking": "", "signature": "EmptyThinkingSig=="}
    assert blocks[1] == {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}
    assert reply.text == "Running the script."
    assert reply.tool_calls[0].arguments == '{"code": "print(6*7)"}'
    assert blocks[3]["input"] == {"code": "print(6*7)"}
    # message_delta usage is cumulative: the last value wins (89), it is not added to 2 or 40.
    assert reply.usage.output_tokens == 89
    assert reply.usage.input_tokens == 472 + 2048 and reply.usage.cache_read_tokens == 2048


def test_anthropic_empty_and_redacted_thinking_go_back_verbatim() -> None:
    anthropic = provider("anthropic")
    reply = anthropic.normalize(load("anthropic_stream_redacted.json"))
    request = anthropic.build_request(
        system=[],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "run it"}]},
            reply.to_message(),
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01Py",
                        "content": [{"type": "text", "text": "42"}],
                        "is_error": False,
                    }
                ],
            },
        ],
        tools=[],
    )
    sent = request["messages"][1]["content"]
    assert sent[0] == {"type": "thinking", "thinking": "", "signature": "EmptyThinkingSig=="}
    assert sent[1] == {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}


def test_chat_cached_and_reasoning_tokens_and_unparseable_arguments() -> None:
    reply = provider("openai_chat").normalize(load("openai_chat_cached.json"))
    assert reply.stop_reason == "tool_use"
    assert reply.text == ""
    assert [c.arguments for c in reply.tool_calls] == ['{"code": "print(1)"}', '{"expression": "1+"']
    # The broken arguments are kept as text for repair, and go back unchanged.
    broken = reply.content_blocks[1]
    assert broken["input"] == {} and broken["arguments_text"] == '{"expression": "1+"'
    # prompt_tokens already includes cached_tokens: no addition.
    assert reply.usage == Usage(input_tokens=2006, output_tokens=300, cache_read_tokens=1920, reasoning_tokens=192)


def test_chat_tool_call_arguments_go_back_exactly() -> None:
    chat = provider("openai_chat")
    reply = chat.normalize(load("openai_chat_cached.json"))
    request = chat.build_request(
        system=[],
        messages=[{"role": "user", "content": [{"type": "text", "text": "go"}]}, reply.to_message()],
        tools=[],
    )
    calls = request["messages"][1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ['{"code": "print(1)"}', '{"expression": "1+"']


def test_deepseek_reasoning_content_becomes_thinking() -> None:
    reply = provider("openai_chat").normalize(load("deepseek_reasoner.json"))
    assert reply.thinking == "6 times 7 is 42."
    assert reply.text == "The answer is \\boxed{42}."
    assert reply.stop_reason == "end_turn"
    assert reply.usage == Usage(input_tokens=120, output_tokens=58, cache_read_tokens=64, reasoning_tokens=40)


def test_chat_stream_merges_repeated_ids_and_interleaved_parallel_calls() -> None:
    reply = provider("openai_chat").normalize(load("chat_stream_parallel_repeated.json"))
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_x", "tool-math-calculate", '{"expression": "6*7"}'),
        ("call_y", "tool-files-read_file", '{"path": "a.csv"}'),
    ]
    assert reply.text == "Two calls."
    assert reply.usage == Usage(input_tokens=900, output_tokens=44, cache_read_tokens=512)


def test_server_without_usage_gets_an_estimate_marked_as_such() -> None:
    reply = provider("openai_chat").normalize(load("local_no_usage.json"))
    assert reply.usage.estimated is True
    assert reply.usage.input_tokens == 100  # 400 prompt characters / 4
    assert reply.usage.output_tokens == 7  # ceil(28 / 4)


def test_responses_reasoning_item_is_kept_for_the_next_turn() -> None:
    responses = provider("openai_responses")
    reply = responses.normalize(load("openai_responses_reasoning.json"))
    assert reply.thinking == "**Planning** I should read the CSV."
    assert reply.text == "Reading the file."
    assert reply.stop_reason == "tool_use"
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_12345xyz", "tool-files-read_file", '{"path":"a.csv"}')
    ]
    assert reply.usage == Usage(input_tokens=3000, output_tokens=250, cache_read_tokens=2816, reasoning_tokens=192)
    request = responses.build_request(
        system=[{"type": "text", "text": "sys"}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "read a.csv"}]},
            reply.to_message(),
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_12345xyz",
                        "content": [{"type": "text", "text": "a,b"}],
                        "is_error": False,
                    }
                ],
            },
        ],
        tools=[],
    )
    items = request["input"]
    assert items[1] == {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "**Planning** I should read the CSV."}],
        "id": "rs_6876cf02e0bc8192b74af0fb64b715ff",
        "encrypted_content": "gAAAAABodnk0enc==",
    }
    assert [i["type"] for i in items] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
    ]
    assert items[3]["arguments"] == '{"path":"a.csv"}'
    assert items[4] == {"type": "function_call_output", "call_id": "call_12345xyz", "output": "a,b"}


def test_responses_incomplete_maps_to_max_tokens() -> None:
    reply = provider("openai_responses").normalize(load("openai_responses_incomplete.json"))
    assert reply.stop_reason == "max_tokens"
    assert reply.text == "The answer is"
    assert reply.usage.reasoning_tokens == 12


@pytest.mark.parametrize(
    ("protocol", "raw"),
    [
        (
            "anthropic",
            {
                "id": "msg_1",
                "type": "message",
                "content": [],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 3, "output_tokens": 0},
            },
        ),
        (
            "openai_chat",
            {
                "id": "c",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}],
            },
        ),
        ("openai_responses", {"id": "r", "status": "completed", "output": []}),
    ],
)
def test_empty_reply_is_a_clear_error(protocol: str, raw: dict[str, Any]) -> None:
    with pytest.raises(ProviderResponseError) as info:
        provider(protocol).normalize(raw)
    assert info.value.kind == "empty_reply"
    assert "empty reply" in str(info.value)


def test_unreadable_body_is_a_bad_response() -> None:
    with pytest.raises(ProviderResponseError) as info:
        provider("openai_chat").normalize({"id": "x", "choices": []})
    assert info.value.kind == "bad_response"


def test_failed_response_raises_classified_error() -> None:
    raw = {
        "id": "r",
        "status": "failed",
        "output": [],
        "error": {"code": "server_error", "message": "The model failed to generate a response."},
    }
    with pytest.raises(ProviderCallError) as info:
        provider("openai_responses").normalize(raw)
    assert info.value.kind == "server" and info.value.retryable


def test_usage_to_dict_has_every_field_in_order_and_round_trips() -> None:
    usage = Usage(
        input_tokens=5, output_tokens=3, cache_read_tokens=2, cache_write_tokens=1, reasoning_tokens=1, estimated=True
    )
    assert list(usage.to_dict()) == [*USAGE_COUNTS, "estimated"]  # the one-hour count only when there is one
    assert Usage.from_dict(usage.to_dict()) == usage
    hour = Usage(input_tokens=5, cache_write_tokens=4, cache_write_1h_tokens=3)
    assert hour.to_dict()["cache_write_1h_tokens"] == 3 and Usage.from_dict(hour.to_dict()) == hour
    assert hour != Usage(input_tokens=5, cache_write_tokens=4) and (hour + hour).cache_write_1h_tokens == 6


def test_a_saved_reply_without_one_hour_writes_is_recorded_as_before() -> None:
    # The record of a reply as every run before the one-hour count wrote it, byte for byte (orjson's form of
    # the dataclass Usage was): old runs' node outputs still compare equal on replay (flowllm/run/replay_audit.py).
    usage = Usage(input_tokens=5, output_tokens=3, cache_write_tokens=1)
    reply = ModelResponse(text="hi", stop_reason="end_turn", usage=usage)
    expected = """{
  "text": "hi",
  "stop_reason": "end_turn",
  "content_blocks": [],
  "tool_calls": [],
  "thinking": "",
  "usage": {
    "input_tokens": 5,
    "output_tokens": 3,
    "cache_read_tokens": 0,
    "cache_write_tokens": 1,
    "reasoning_tokens": 0,
    "estimated": false
  },
  "model": "",
  "id": ""
}
"""
    assert unmasked_record(reply).decode() == expected
    hour = ModelResponse(text="hi", stop_reason="end_turn", usage=Usage(cache_write_tokens=2, cache_write_1h_tokens=2))
    assert b'"cache_write_1h_tokens": 2' in unmasked_record(hour)
