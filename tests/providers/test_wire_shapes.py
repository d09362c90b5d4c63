"""The exact request shapes each protocol sends, checked against what strict compatible servers accept.

The server-side shapes below are llama-cpp-python 0.3.36's request message types (``llama_cpp/llama_types.py``,
validated by its pydantic server), plus the rule its chat templates add: content is concatenated as a string,
so text-only content in a list fails (HTTP 500 "can only concatenate str (not "list") to str"). LiteLLM's
proxy adds: the Anthropic ``system`` field as a string, Responses assistant content as a string, no
``reasoning`` for backends that refuse it. Every model the installed anthropic and openai SDKs list gets a
request its model table (flowllm/providers/wire/models.py) says it takes, in the SDK's own parameter types. A change
to the providers that breaks one of these fails here, in the default suite, without a real server.
"""

from __future__ import annotations

import json
import typing
from typing import Any, Literal, NotRequired

import anthropic.types
import openai.types
import openai.types.shared
import openai.types.shared_params
import pytest
from pydantic import TypeAdapter
from typing_extensions import TypedDict

from flowllm.config.provider_schema import ContentFormat, WireConfig
from flowllm.core.types import Message
from flowllm.providers import build_provider
from flowllm.providers.base import BaseProvider
from flowllm.providers.wire.models import SAMPLING, ModelRule, Thinking, rule_for

from .conftest import SYSTEM, TOOLS, make_cfg

IMAGE = {"type": "image", "media_type": "image/png", "data": "iVBORw0KGgo="}


# ----- llama-cpp-python 0.3.36's request types (copied shapes) ---------------------------------------------
class _TextPart(TypedDict):
    type: Literal["text"]
    text: str


class _ImageUrl(TypedDict):
    url: str


class _ImagePart(TypedDict):
    type: Literal["image_url"]
    image_url: _ImageUrl | str


class _System(TypedDict):
    role: Literal["system"]
    content: str | None


class _User(TypedDict):
    role: Literal["user"]
    content: str | list[_TextPart | _ImagePart] | None


class _Function(TypedDict):
    name: str
    arguments: str


class _ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: _Function


class _Assistant(TypedDict):
    role: Literal["assistant"]
    content: NotRequired[str]
    tool_calls: NotRequired[list[_ToolCall]]


class _Tool(TypedDict):
    role: Literal["tool"]
    content: str | None
    tool_call_id: str


LLAMACPP_MESSAGES = TypeAdapter(list[_System | _User | _Assistant | _Tool])


def assert_llamacpp_accepts(request: dict[str, Any]) -> None:
    LLAMACPP_MESSAGES.validate_python(request["messages"], strict=True)
    for message in request["messages"]:
        content = message.get("content")
        if isinstance(content, list):  # a list is only for media; the template concatenates strings
            assert any(p["type"] != "text" for p in content), f"text-only content sent as a list: {message}"
    assert request.get("temperature", 0.0) is not None  # `temperature: float` there, not Optional
    for key in ("reasoning_effort", "store", "metadata", "parallel_tool_calls", "max_completion_tokens"):
        assert key not in request, f"{key} sent to a server that does not take it"


# ----- the histories every loop produces --------------------------------------------------------------------
def native_loop() -> list[Message]:
    """Task, a call with text, two results with the summary prompt merged in, a call without text, a result."""
    call = {"type": "tool_use", "name": "tool-math-calculate", "input": {"expression": "1+1"}}
    return [
        {"role": "user", "content": [{"type": "text", "text": "Compute."}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Two calls."}, {**call, "id": "c1"}, {**call, "id": "c2"}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "2"}]},
                {"type": "tool_result", "tool_use_id": "c2", "content": [{"type": "text", "text": "2"}]},
            ],
        },
        {"role": "assistant", "content": [{**call, "id": "c3"}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c3", "content": [{"type": "text", "text": "2"}]},
                {"type": "text", "text": "You have used every turn: give your final answer now."},
            ],
        },
    ]


def text_loop() -> list[Message]:
    """The text protocol: calls in the assistant's text, two results (and the summary prompt) as user text."""
    return [
        {"role": "user", "content": [{"type": "text", "text": "Compute."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<use_mcp_tool>...</use_mcp_tool>"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<tool_result>2</tool_result>"},
                {"type": "text", "text": "<tool_result>3</tool_result>"},
                {"type": "text", "text": "You have used every turn: give your final answer now."},
            ],
        },
    ]


def provider(protocol: str, **overrides: Any) -> BaseProvider:
    return build_provider(make_cfg(protocol, **overrides), base_url="http://127.0.0.1:9/v1", api_key="k")


def local(protocol: str = "openai_chat", **overrides: Any) -> BaseProvider:
    """What conf/provider/local.yaml sets."""
    settings: dict[str, Any] = {"accepts": ["text"], "cache": False, "stream": True, "temperature": 0.0}
    settings["wire"] = WireConfig(reasoning_effort=False)
    return provider(protocol, **{**settings, **overrides})


@pytest.mark.parametrize("tool_protocol", ["native", "xml"])
@pytest.mark.parametrize("thinking", ["disabled", "enabled"])
def test_chat_requests_are_what_llamacpp_accepts(tool_protocol: str, thinking: str) -> None:
    p = local(tool_protocol=tool_protocol, thinking=thinking)
    history = native_loop() if tool_protocol == "native" else text_loop()
    request = p.build_request(system=SYSTEM, messages=history, tools=TOOLS)
    assert_llamacpp_accepts({k: v for k, v in request.items() if k != "stream_options"})
    assert request["stream_options"] == {"include_usage": True}  # unknown keys are ignored there
    messages = request["messages"]
    if tool_protocol == "native":
        # "" beside tool calls, never null; one tool message per result; the summary prompt as a string.
        assert messages[2]["content"] == "Two calls." and messages[5]["content"] == ""
        roles = ["system", "user", "assistant", "tool", "tool", "assistant", "tool", "user"]
        assert [m["role"] for m in messages] == roles
        assert messages[-1]["content"] == "You have used every turn: give your final answer now."
    else:
        assert "tools" not in request
        assert messages[-1]["content"].count("<tool_result>") == 2  # joined into one string


def test_media_a_text_only_model_cannot_take_is_described_without_any_hook() -> None:
    history: list[Message] = [
        {"role": "user", "content": [{"type": "text", "text": "Look."}, IMAGE]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "cam", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "x"}, IMAGE]}
            ],
        },
    ]
    request = local().build_request(system=SYSTEM, messages=history, tools=[])
    sent = json.dumps(request)
    assert IMAGE["data"] not in sent and sent.count("image not shown") == 2
    assert_llamacpp_accepts(request)
    assert history[0]["content"][1] == IMAGE  # the history keeps the original
    # A model that takes images gets them as parts.
    vision = local(accepts=["text", "image"]).build_request(system=SYSTEM, messages=history, tools=[])
    assert vision["messages"][1]["content"][1]["type"] == "image_url"


@pytest.mark.parametrize("protocol", ["openai_chat", "openai_responses", "anthropic"])
def test_content_format_parts_and_string(protocol: str) -> None:
    history = text_loop()
    parts = provider(protocol, content_format=ContentFormat.parts, cache=False)
    as_parts = parts.build_request(system=SYSTEM, messages=history, tools=[])
    string = provider(protocol, content_format=ContentFormat.string, cache=False)
    as_string = string.build_request(system=SYSTEM, messages=[*history, _image_turn()], tools=[])
    key = "input" if protocol == "openai_responses" else "messages"
    assert all(isinstance(m["content"], list) for m in as_parts[key])
    assert all(isinstance(m["content"], str) for m in as_string[key])  # the image became its description
    assert "image not shown" in json.dumps(as_string[key][-1])
    if protocol == "anthropic":
        assert isinstance(as_parts["system"], list) and as_string["system"] == SYSTEM[0]["text"]
    elif protocol == "openai_chat":
        assert as_parts["messages"][0]["content"] == [{"type": "text", "text": SYSTEM[0]["text"]}]


def _image_turn() -> Message:
    return {"role": "user", "content": [{"type": "text", "text": "And this?"}, IMAGE]}


def test_anthropic_system_is_a_string_unless_it_carries_a_cache_breakpoint() -> None:
    history = native_loop()
    request = provider("anthropic", cache=False, tool_protocol="native").build_request(
        system=SYSTEM, messages=history, tools=TOOLS
    )
    assert request["system"] == SYSTEM[0]["text"]  # what LiteLLM's proxy takes
    assert request["messages"][0]["content"] == "Compute."
    assert isinstance(request["messages"][2]["content"], list)  # tool results stay blocks
    assert request["messages"][2]["content"][0]["content"] == "2"
    cached = [{**SYSTEM[0], "cache_control": {"type": "ephemeral"}}]
    with_cache = provider("anthropic", cache=True).build_request(system=cached, messages=history, tools=[])
    assert with_cache["system"] == [{"type": "text", "text": SYSTEM[0]["text"], "cache_control": {"type": "ephemeral"}}]


def test_responses_requests_pass_a_proxy_to_other_backends() -> None:
    wire = WireConfig(store=None, reasoning_effort=False)
    p = provider("openai_responses", tool_protocol="native", thinking="enabled", wire=wire)
    request = p.build_request(system=SYSTEM, messages=native_loop(), tools=TOOLS)
    for key in ("store", "reasoning", "include", "reasoning_effort", "temperature"):
        assert key not in request
    assistant = [i for i in request["input"] if i.get("role") == "assistant"]
    assert assistant == [{"type": "message", "role": "assistant", "content": "Two calls."}]
    assert request["input"][0]["content"] == "Compute."
    # OpenAI's own API: stateless and reasoning on (the gpt5.yaml defaults).
    default = provider("openai_responses", thinking="enabled").build_request(system=SYSTEM, messages=[], tools=[])
    assert default["store"] is False and default["reasoning"]["effort"] == "low"


def test_optional_fields_are_sent_only_when_configured() -> None:
    plain = provider("openai_chat", stream=True, tool_protocol="native")
    request = plain.build_request(system=SYSTEM, messages=native_loop(), tools=TOOLS)
    assert request["max_tokens"] == 4096 and "parallel_tool_calls" not in request and "metadata" not in request
    wire = WireConfig(
        stream_usage=False,
        parallel_tool_calls=False,
        max_tokens_field="max_completion_tokens",
        metadata={"a": "b"},
        store=True,  # Chat takes metadata only with store: true
    )
    asked = provider("openai_chat", stream=True, tool_protocol="native", wire=wire)
    request = asked.build_request(system=SYSTEM, messages=native_loop(), tools=TOOLS)
    assert "stream_options" not in request and "max_tokens" not in request
    assert request["max_completion_tokens"] == 4096
    assert request["parallel_tool_calls"] is False and request["metadata"] == {"a": "b"}
    assert request["store"] is True


# ----- every model the SDKs list, shaped by the model table --------------------------------------------------
def sdk_models(literal_type: Any) -> list[str]:
    """The model names of an SDK's ``Model`` type (a union of ``str`` and literals)."""
    names: list[str] = []
    for arg in typing.get_args(literal_type):
        if isinstance(arg, str):
            names.append(arg)
        elif arg is not str:
            names.extend(sdk_models(arg))
    return names


ANTHROPIC_MODELS = sdk_models(anthropic.types.Model)
OPENAI_MODELS = sdk_models(openai.types.ChatModel)
ANTHROPIC_THINKING = TypeAdapter(anthropic.types.ThinkingConfigParam)
ANTHROPIC_OUTPUT = TypeAdapter(anthropic.types.OutputConfigParam)
OPENAI_EFFORT = TypeAdapter(openai.types.shared.ReasoningEffort)
OPENAI_REASONING = TypeAdapter(openai.types.shared_params.Reasoning)


def assert_anthropic_takes(request: dict[str, Any], rule: ModelRule, asked: bool) -> None:
    thinking = request.get("thinking")
    if thinking is not None:
        ANTHROPIC_THINKING.validate_python(thinking, strict=True)
        assert Thinking(thinking["type"]) in rule.thinking, f"thinking {thinking['type']} sent to {rule.label}"
    if "output_config" in request:
        ANTHROPIC_OUTPUT.validate_python(request["output_config"], strict=True)
    assert (thinking is not None) == (asked and bool(rule.thinking)), "thinking asked for and taken, not sent"


def assert_openai_takes(request: dict[str, Any], rule: ModelRule, protocol: str, asked: bool) -> None:
    key = "reasoning_effort" if protocol == "openai_chat" else "reasoning"
    if key in request:
        (OPENAI_EFFORT if key == "reasoning_effort" else OPENAI_REASONING).validate_python(request[key], strict=True)
        assert Thinking.effort in rule.thinking, f"{key} sent to {rule.label}"
    assert (key in request) == (asked and bool(rule.thinking)), "reasoning asked for and taken, not sent"
    if rule.reasoning and protocol == "openai_chat":
        assert "max_tokens" not in request and request["max_completion_tokens"] == 4096


@pytest.mark.parametrize(
    ("protocols", "model"),
    [(("anthropic",), m) for m in ANTHROPIC_MODELS] + [(("openai_chat", "openai_responses"), m) for m in OPENAI_MODELS],
)
def test_every_sdk_model_gets_only_what_its_table_entry_takes(protocols: tuple[str, ...], model: str) -> None:
    rule = rule_for(model)
    assert rule is not None, f"{model} has no entry in the model table"
    extra = {"top_p": 0.9, "top_k": 40}  # beside provider.temperature: every sampling parameter asked for
    for protocol in protocols:
        for thinking in ("disabled", "enabled", "adaptive"):
            p = provider(protocol, model=model, thinking=thinking, temperature=0.5, extra_body=dict(extra))
            request = p.build_request(system=SYSTEM, messages=native_loop(), tools=TOOLS)
            refused = [k for k in SAMPLING if k in request and k not in rule.sampling]
            assert not refused, f"{protocol} {model} thinking={thinking}: {refused} sent to {rule.label}"
            if protocol == "anthropic":
                assert_anthropic_takes(request, rule, asked=thinking != "disabled")
            else:
                assert_openai_takes(request, rule, protocol, asked=thinking != "disabled")


def test_the_sdk_lists_hold_the_models_this_fix_is_about() -> None:
    assert {"claude-opus-4-7", "claude-opus-4-8", "claude-sonnet-5", "claude-haiku-4-5"} <= set(ANTHROPIC_MODELS)
    assert {"o3", "gpt-5", "gpt-4o", "gpt-5-chat-latest"} <= set(OPENAI_MODELS)
