"""The emulator refuses what the real APIs refuse, with their messages, so history bugs fail here."""

from __future__ import annotations

from typing import Any

import pytest

from flowllm.emulator import anthropic_wire, openai_chat_wire, openai_responses_wire
from flowllm.emulator.common import RequestError, encrypted_reasoning, thinking_signature


def anthropic(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 2000, "messages": messages, **extra}


USE = {"type": "tool_use", "id": "toolu_1", "name": "tool-math-calculate", "input": {"expression": "1"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}
THINK = {"type": "thinking", "thinking": "t", "signature": thinking_signature("t")}
Q = {"role": "user", "content": "q"}


def refused(parse: Any, body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        parse(body)
    assert fragment in info.value.message
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (anthropic([{"role": "assistant", "content": "a"}]), 'first message must use the "user" role'),
        (anthropic([Q, {"role": "assistant", "content": [USE]}]), "without `tool_result` blocks"),
        (
            anthropic([Q, {"role": "assistant", "content": [USE]}, {"role": "user", "content": "no result"}]),
            "without `tool_result` blocks immediately after: toolu_1",
        ),
        (
            anthropic([Q, {"role": "assistant", "content": "a"}, {"role": "user", "content": [RESULT]}]),
            "unexpected `tool_use_id`",
        ),
        (anthropic([{"role": "user", "content": [{"type": "text", "text": ""}]}]), "must be non-empty"),
        (
            anthropic(
                [Q, {"role": "assistant", "content": [USE]}, {"role": "user", "content": [RESULT]}],
                thinking={"type": "enabled", "budget_tokens": 1024},
            ),
            "Expected `thinking`",
        ),
        (
            anthropic(
                [
                    Q,
                    {"role": "assistant", "content": [{**THINK, "thinking": "edited"}, USE]},
                    {"role": "user", "content": [RESULT]},
                ]
            ),
            "Invalid `signature`",
        ),
        (
            anthropic([Q], thinking={"type": "enabled", "budget_tokens": 4000}),
            "greater than `thinking.budget",
        ),
        (anthropic([Q], thinking={"type": "enabled", "budget_tokens": 1500}, temperature=0.5), "temperature"),
        (
            anthropic(
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": str(i), "cache_control": {"type": "ephemeral"}} for i in range(5)
                        ],
                    }
                ]
            ),
            "maximum of 4 blocks with cache_control",
        ),
        (anthropic([Q], top_logprobs=3), "Extra inputs are not permitted"),
        ({"model": "m", "messages": [Q]}, "max_tokens"),
    ],
)
def test_anthropic_refusals(body: dict[str, Any], fragment: str) -> None:
    refused(anthropic_wire.parse_request, body, fragment)


def test_anthropic_valid_thinking_loop_counts_turns_and_results() -> None:
    parsed = anthropic_wire.parse_request(
        anthropic(
            [Q, {"role": "assistant", "content": [THINK, USE]}, {"role": "user", "content": [RESULT]}],
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    )
    assert (parsed.turn, parsed.tool_results, parsed.thinking) == (2, ["1"], True)


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, **extra}


CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (chat([Q, CALL, Q]), "did not have response messages: call_1"),
        (chat([Q, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]), "must be a response to a"),
        (
            chat(
                [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}],
                    }
                ]
            ),
            "cache_control",
        ),
        (chat([Q], stream_options={"include_usage": True}), "only allowed when 'stream' is set to true"),
        (chat([{"role": "robot", "content": "x"}]), "Invalid value: 'robot'"),
        (chat([Q], thinking_tokens=5), "Unrecognized request argument supplied: thinking_tokens"),
    ],
)
def test_chat_refusals(body: dict[str, Any], fragment: str) -> None:
    refused(openai_chat_wire.parse_request, body, fragment)


def responses(items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": items, "store": False, **extra}


FC = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
FCO = {"type": "function_call_output", "call_id": "call_1", "output": "1"}
UQ = {"role": "user", "content": "q"}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (responses([UQ, FCO]), "No tool call found for function call output with call_id call_1"),
        (responses([UQ, FC]), "No tool output found for function call call_1"),
        (responses([UQ, {"type": "reasoning", "id": "rs_1", "summary": []}, FC, FCO]), "not persisted"),
        (
            responses([UQ, {"type": "reasoning", "summary": [], "encrypted_content": "Zm9v"}, FC, FCO]),
            "could not be verified",
        ),
        (responses([UQ, FC, FCO], reasoning={"effort": "low"}), "without its required 'reasoning' item"),
        (responses([UQ], max_output_tokens=5), "max_output_tokens"),
        (responses([UQ], previous_response=1), "Unknown parameter"),
    ],
)
def test_responses_refusals(body: dict[str, Any], fragment: str) -> None:
    refused(openai_responses_wire.parse_request, body, fragment)


def test_responses_valid_reasoning_loop() -> None:
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": encrypted_reasoning("")}
    parsed = openai_responses_wire.parse_request(responses([UQ, reasoning, FC, FCO], reasoning={"effort": "low"}))
    assert (parsed.turn, parsed.tool_results, parsed.thinking) == (2, ["1"], True)
