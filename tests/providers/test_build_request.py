"""Canonical history -> each wire format."""

from __future__ import annotations

from typing import Any

from flowllm.core.types import Message
from flowllm.providers import build_provider
from flowllm.providers.base import BaseProvider

from .conftest import TOOLS, make_cfg

CC = {"type": "ephemeral", "ttl": "1h"}
SYSTEM = [{"type": "text", "text": "Be careful.", "cache_control": CC}]
IMAGE = {"type": "image", "media_type": "image/png", "data": "iVBORw0KGgo="}
HISTORY: list[Message] = [
    {"role": "user", "content": [{"type": "text", "text": "Describe and compute."}, IMAGE]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "plan", "signature": "sig"},
            {"type": "text", "text": "Computing."},
            {
                "type": "tool_use",
                "id": "call_1",
                "name": "tool-math-calculate",
                "input": {"expression": "1+1"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "call_1",
                "is_error": True,
                "content": [{"type": "text", "text": "boom"}, IMAGE],
            },
            {"type": "text", "text": "Try again.", "cache_control": CC},
        ],
    },
]


def provider(protocol: str, **overrides: Any) -> BaseProvider:
    return build_provider(make_cfg(protocol, **overrides), base_url="http://127.0.0.1:9", api_key="unused")


def test_anthropic_request_carries_blocks_breakpoints_and_thinking_budget() -> None:
    request = provider(
        "anthropic", tool_protocol="native", thinking="enabled", max_tokens=1000, temperature=0.2, stream=True
    ).build_request(system=SYSTEM, messages=HISTORY, tools=TOOLS)
    assert request["system"] == [{"type": "text", "text": "Be careful.", "cache_control": CC}]
    assert request["thinking"] == {"type": "enabled", "budget_tokens": 2000}
    assert request["max_tokens"] == 2001  # raised above the budget, as the API requires
    assert "temperature" not in request  # only 1 is allowed with thinking: left out
    assert request["stream"] is True
    assert [t["name"] for t in request["tools"]] == ["tool-math-calculate", "tool-files-read_file"]
    user, assistant, results = request["messages"]
    assert user["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    assert assistant["content"][0] == {"type": "thinking", "thinking": "plan", "signature": "sig"}
    assert results["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "call_1",
        "is_error": True,
        "content": [
            {"type": "text", "text": "boom"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
            },
        ],
    }
    assert results["content"][1] == {"type": "text", "text": "Try again.", "cache_control": CC}


def test_anthropic_without_cache_strips_breakpoints() -> None:
    anthropic = provider("anthropic", cache=False)
    assert anthropic.supports_cache_control is False
    request = anthropic.build_request(system=SYSTEM, messages=HISTORY, tools=TOOLS)
    assert "cache_control" not in str(request)
    assert "tools" not in request  # xml protocol: tools are taught in the system prompt


def test_chat_request_splits_tool_results_and_strips_cache_control() -> None:
    request = provider(
        "openai_chat", tool_protocol="native", stream=True, temperature=0.0, extra_body={"top_k": 20}
    ).build_request(system=SYSTEM, messages=HISTORY, tools=TOOLS)
    assert "cache_control" not in str(request)
    assert request["stream_options"] == {"include_usage": True}
    assert request["top_k"] == 20 and request["temperature"] == 0.0
    assert request["tools"][0] == {
        "type": "function",
        "function": {
            "name": "tool-math-calculate",
            "description": "Evaluate an arithmetic expression.",
            "parameters": TOOLS[0]["input_schema"],
        },
    }
    roles = [m["role"] for m in request["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert request["messages"][0]["content"] == "Be careful."
    assert request["messages"][1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
    }
    assistant = request["messages"][2]
    assert assistant["content"] == "Computing."
    assert assistant["reasoning_content"] == "plan"
    assert assistant["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "tool-math-calculate", "arguments": '{"expression": "1+1"}'},
        }
    ]
    assert request["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "boom"}
    # The tool result's image follows in a user message (tool messages carry text only).
    assert request["messages"][4]["content"][0]["type"] == "image_url"
    assert request["messages"][4]["content"][1] == {"type": "text", "text": "Try again."}


def test_responses_request_is_stateless_and_orders_items() -> None:
    request = provider("openai_responses", tool_protocol="native", thinking="enabled").build_request(
        system=SYSTEM, messages=HISTORY, tools=TOOLS
    )
    assert request["instructions"] == "Be careful."
    assert request["store"] is False
    assert request["include"] == ["reasoning.encrypted_content"]
    assert request["reasoning"] == {"effort": "low", "summary": "auto"}
    assert request["tools"][1]["name"] == "tool-files-read_file"
    assert "cache_control" not in str(request)
    kinds = [(i["type"], i.get("role")) for i in request["input"]]
    # The Anthropic thinking block has no meaning here and is dropped.
    assert kinds == [
        ("message", "user"),
        ("message", "assistant"),
        ("function_call", None),
        ("function_call_output", None),
        ("message", "user"),
    ]
    assert request["input"][3] == {"type": "function_call_output", "call_id": "call_1", "output": "boom"}


def test_chat_thinking_sets_reasoning_effort() -> None:
    request = provider("openai_chat", thinking="enabled").build_request(system=[], messages=HISTORY[:1], tools=[])
    assert request["reasoning_effort"] == "low"
