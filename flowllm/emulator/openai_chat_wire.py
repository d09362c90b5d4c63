"""The OpenAI Chat Completions protocol, server side: validation, ``chat.completion`` JSON and chunk SSE.

Validation covers what a history bug trips: roles, every assistant ``tool_calls`` answered by ``role: tool``
messages right after it (and no tool message without its call), content types, ``stream_options`` only with
``stream``, and no Anthropic ``cache_control`` leaking into an OpenAI request.
"""

from __future__ import annotations

import re
from typing import Any

from flowllm.emulator.common import (
    FIXED_CREATED,
    IMAGE_CHARS,
    ParsedRequest,
    Plan,
    RequestError,
    Unit,
    args_chars,
    chunks,
    is_str,
    require,
    tool_def_chars,
    unescape_tool_result,
    xml_tool_results,
)

ALLOWED_KEYS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning_effort",
        "response_format",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "verbosity",
        "modalities",
        "prediction",
        # Common extensions of compatible servers (DashScope, DeepSeek, vLLM):
        "enable_thinking",
        "thinking_budget",
        "thinking",
        "top_k",
        "repetition_penalty",
        "chat_template_kwargs",
    }
)
ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
FINISH = {
    "end_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
    "stop_sequence": "stop",
}


def error_body(err: RequestError, request_id: str) -> dict[str, Any]:
    return {
        "error": {
            "message": err.message,
            "type": err.error_type,
            "param": err.param,
            "code": err.code or ("invalid_api_key" if err.status == 401 else None),
        }
    }


def _unanswered(ids: list[str]) -> RequestError:
    return RequestError(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(ids)}",
        param="messages",
    )


def _no_cache_control(value: Any, where: str) -> None:
    if isinstance(value, dict):
        require(
            "cache_control" not in value,
            f"Unrecognized request argument supplied: {where}.cache_control",
            param=f"{where}.cache_control",
        )
        for k, v in value.items():
            _no_cache_control(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _no_cache_control(v, f"{where}[{i}]")


def _text_parts(content: Any, where: str, *, allow_images: bool) -> tuple[str, int]:
    """(text, image count) of a message's content, validating its parts."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    require(
        isinstance(content, list),
        f"Invalid type for '{where}.content': expected a string or an array",
        param=f"{where}.content",
    )
    texts: list[str] = []
    images = 0
    for j, part in enumerate(content):
        pw = f"{where}.content[{j}]"
        require(isinstance(part, dict), f"Invalid type for '{pw}': expected an object", param=pw)
        ptype = part.get("type")
        if ptype == "text":
            require(is_str(part.get("text")), f"Missing required parameter: '{pw}.text'.", param=f"{pw}.text")
            texts.append(part["text"])
        elif ptype == "image_url" and allow_images:
            url = (part.get("image_url") or {}).get("url") if isinstance(part.get("image_url"), dict) else None
            require(is_str(url), f"Missing required parameter: '{pw}.image_url.url'.", param=pw)
            images += 1
        else:
            raise RequestError(
                f"Invalid value: '{ptype}'. Supported values are: 'text'"
                + (" and 'image_url'." if allow_images else "."),
                param=f"{pw}.type",
            )
    return "\n".join(texts), images


def _check_settings(body: Any) -> tuple[list[Any], bool, Any]:
    """The body's keys, model, messages, stream and token limits; returns (messages, stream, stream_options)."""
    require(isinstance(body, dict), "We could not parse the JSON body of your request.")
    extra = sorted(set(body) - ALLOWED_KEYS)
    if extra:
        raise RequestError(f"Unrecognized request argument supplied: {extra[0]}", param=extra[0])
    require(is_str(body.get("model")) and body["model"], "you must provide a model parameter", param="model")
    messages = body.get("messages")
    require(
        isinstance(messages, list) and len(messages) > 0,
        "Invalid 'messages': empty array. Expected an array with minimum length 1.",
        param="messages",
    )
    stream = body.get("stream", False)
    require(isinstance(stream, bool), "Invalid type for 'stream': expected a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None:
        require(
            stream,
            "The 'stream_options' parameter is only allowed when 'stream' is set to true.",
            param="stream_options",
        )
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        require(
            value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
            f"Invalid '{key}': integer below minimum value. Expected a value >= 1.",
            param=key,
        )
    return messages, stream, options


def _check_tools(body: Any, units: list[Unit]) -> list[str]:
    """Function tools with well-formed names and parameters; returns the names offered."""
    offered: list[str] = []
    for i, tool in enumerate(body.get("tools") or []):
        fn: Any = tool.get("function") if isinstance(tool, dict) else None
        require(
            isinstance(tool, dict) and tool.get("type") == "function" and isinstance(fn, dict),
            f"Missing required parameter: 'tools[{i}].function'.",
            param=f"tools[{i}]",
        )
        name = fn.get("name")
        require(
            is_str(name) and bool(TOOL_NAME.match(name)),
            f"Invalid 'tools[{i}].function.name': string does not match pattern. Expected a string that "
            "matches the pattern '^[a-zA-Z0-9_-]+$'.",
            param=f"tools[{i}].function.name",
        )
        params = fn.get("parameters")
        require(params is None or isinstance(params, dict), f"Invalid type for 'tools[{i}].function.parameters'")
        units.append(Unit(tool_def_chars(name, fn.get("description"), params), content=tool))
        offered.append(name)
    return offered


def _tool_message(msg: Any, where: str, pending: list[str], units: list[Unit], tool_results: list[str]) -> None:
    """A ``tool`` message answers one call of the assistant message before it."""
    call_id = msg.get("tool_call_id")
    require(
        is_str(call_id),
        f"Missing required parameter: '{where}.tool_call_id'.",
        param=f"{where}.tool_call_id",
    )
    require(
        call_id in pending,
        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
        param=f"{where}.role",
    )
    pending.remove(call_id)
    text, _ = _text_parts(msg.get("content"), where, allow_images=False)
    units.append(Unit(len(text), content=msg))
    tool_results.append(unescape_tool_result(text))


def _assistant_message(msg: Any, where: str, pending: list[str], units: list[Unit]) -> None:
    """An assistant message: its text (null only beside tool calls) and its calls, now pending an answer."""
    calls = msg.get("tool_calls") or []
    require(isinstance(calls, list), f"Invalid type for '{where}.tool_calls'")
    content = msg.get("content")
    require(
        content is not None or bool(calls),
        f"Invalid value for '{where}.content': expected a string, got null.",
        param=f"{where}.content",
    )
    text, _ = _text_parts(content, where, allow_images=False)
    units.append(Unit(len(text), assistant=True, content=content))
    for j, call in enumerate(calls):
        cw = f"{where}.tool_calls[{j}]"
        fn: Any = call.get("function") if isinstance(call, dict) else {}
        require(
            isinstance(fn, dict) and is_str(call.get("id")) and call.get("type") == "function",
            f"Missing required parameter: '{cw}.id'.",
            param=cw,
        )
        require(
            is_str(fn.get("name")) and is_str(fn.get("arguments")),
            f"Missing required parameter: '{cw}.function.arguments'.",
            param=cw,
        )
        require(call["id"] not in pending, f"Duplicate tool_call id: {call['id']}", param=cw)
        pending.append(call["id"])
        units.append(Unit(len(fn["name"]) + args_chars(fn["arguments"]), assistant=True, content=call))


def _check_messages(messages: list[Any], units: list[Unit], tool_results: list[str]) -> int:
    """Roles, contents and the tool loop of every message; returns how many assistant messages there are."""
    assistants = 0
    pending: list[str] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        require(isinstance(msg, dict), f"Invalid type for '{where}': expected an object", param=where)
        role = msg.get("role")
        require(
            role in ROLES,
            f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'tool', and 'developer'.",
            param=f"{where}.role",
        )
        if role == "tool":
            _tool_message(msg, where, pending, units, tool_results)
            continue
        if pending:
            raise _unanswered(pending)
        if role == "assistant":
            assistants += 1
            _assistant_message(msg, where, pending, units)
            continue
        content = msg.get("content")
        require(content is not None, f"Missing required parameter: '{where}.content'.", param=f"{where}.content")
        text, images = _text_parts(content, where, allow_images=role == "user")
        units.append(Unit(len(text) + images * IMAGE_CHARS, content=msg))
        if role == "user":
            tool_results.extend(xml_tool_results(text))
    if pending:
        raise _unanswered(pending)
    return assistants


def parse_request(body: Any) -> ParsedRequest:
    messages, stream, options = _check_settings(body)
    _no_cache_control(messages, "messages")
    _no_cache_control(body.get("tools"), "tools")
    units: list[Unit] = []
    tool_results: list[str] = []
    offered = _check_tools(body, units)
    assistants = _check_messages(messages, units, tool_results)
    thinking = (
        body.get("reasoning_effort") in ("low", "medium", "high")
        or body.get("enable_thinking") is True
        or (isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "enabled")
    )
    last_assistant = messages[-1].get("role") == "assistant"
    return ParsedRequest(
        model=body["model"],
        turn=max(assistants + 1 - (1 if last_assistant else 0), 1),
        tool_results=tool_results,
        units=units,
        stream=stream,
        tools_offered=offered,
        thinking=thinking,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        body=body,
    )


def _usage(plan: Plan) -> dict[str, Any]:
    return {
        "prompt_tokens": plan.prompt_tokens,  # includes the cached part, as the real API counts
        "completion_tokens": plan.output_tokens,
        "total_tokens": plan.prompt_tokens + plan.output_tokens,
        "prompt_tokens_details": {"cached_tokens": plan.cache.read, "audio_tokens": 0},  # prompt_cache.py
        "completion_tokens_details": {
            "reasoning_tokens": plan.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _finish(plan: Plan) -> str:
    return FINISH.get(plan.stop_reason, "stop")


def completion_json(plan: Plan, parsed: ParsedRequest | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": plan.text or None, "refusal": None}
    if plan.thinking:
        message["reasoning_content"] = plan.thinking
    if plan.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in plan.tool_calls
        ]
    return {
        "id": plan.ident("chatcmpl-"),
        "object": "chat.completion",
        "created": FIXED_CREATED,
        "model": plan.model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(plan), "logprobs": None}],
        "usage": _usage(plan),
        "system_fingerprint": "fp_flowllm_emulator",
    }


def completion_events(plan: Plan, parsed: ParsedRequest) -> list[tuple[str | None, Any]]:
    base = {
        "id": plan.ident("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": FIXED_CREATED,
        "model": plan.model,
        "system_fingerprint": "fp_flowllm_emulator",
    }
    if parsed.include_usage:
        base["usage"] = None  # every chunk but the last says usage: null when usage was asked for

    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
        return None, {
            **base,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    events: list[tuple[str | None, Any]] = [chunk({"role": "assistant", "content": "", "refusal": None})]
    if plan.thinking:
        events.extend(chunk({"reasoning_content": p}) for p in chunks(plan.thinking))
    if plan.text:
        events.extend(chunk({"content": p}) for p in chunks(plan.text))
    for index, call in enumerate(plan.tool_calls):
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        for piece in chunks(call.arguments, 12):
            events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    events.append(chunk({}, _finish(plan)))
    if parsed.include_usage:
        events.append((None, {**base, "choices": [], "usage": _usage(plan)}))
    events.append((None, "[DONE]"))
    return events
