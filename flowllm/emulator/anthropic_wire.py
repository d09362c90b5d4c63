"""The Anthropic Messages protocol, server side: strict request validation, JSON and SSE replies.

Validation follows the real API's rules that a history bug trips: roles, non-empty text blocks, every
``tool_use`` answered by a ``tool_result`` in the next message (and no orphan results), thinking blocks that
keep their signature and still lead the assistant message of an open tool loop when thinking is on, at most
four cache breakpoints, thinking budget below ``max_tokens``, unknown top-level keys refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from flowllm.emulator.common import (
    IMAGE_CHARS,
    ParsedRequest,
    Plan,
    RequestError,
    Unit,
    args_chars,
    chunks,
    is_str,
    redacted_valid,
    require,
    signature_valid,
    tool_def_chars,
    unescape_tool_result,
    xml_tool_results,
)
from flowllm.emulator.prompt_cache import breakpoint_ttls

ALLOWED_KEYS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "metadata",
        "thinking",
        "service_tier",
        "cache_control",
        "container",
        "output_config",
        "inference_geo",
        "speed",
        "context_management",
        "mcp_servers",
    }
)
USER_BLOCKS = frozenset({"text", "image", "tool_result", "document", "search_result"})
ASSISTANT_BLOCKS = frozenset({"text", "thinking", "redacted_thinking", "tool_use", "server_tool_use"})
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
STOP_REASONS = {"end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "pause_turn"}


def error_body(err: RequestError, request_id: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": err.error_type, "message": err.message},
        "request_id": request_id,
    }


def _unanswered(where: str, ids: list[str]) -> RequestError:
    return RequestError(
        f"{where}: `tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{', '.join(ids)}. Each `tool_use` block must have a corresponding `tool_result` block in the next "
        "message."
    )


def _check_cache_control(cc: Any, where: str, counter: list[int]) -> str | None:
    """A block's ``cache_control`` checked and counted; returns its TTL ("5m" when not given), None without."""
    if cc is None:
        return None
    require(
        isinstance(cc, dict) and cc.get("type") == "ephemeral",
        f"{where}.cache_control.type: Input should be 'ephemeral'",
    )
    ttl = cc.get("ttl")
    require(ttl in (None, "5m", "1h"), f"{where}.cache_control.ttl: Input should be '5m' or '1h'")
    counter[0] += 1
    require(counter[0] <= 4, "A maximum of 4 blocks with cache_control may be provided. Found 5.")
    return str(ttl or "5m")


def _unit(chars: int, sent: Any, ttl: str | None, assistant: bool = False) -> Unit:
    """A prompt unit; its content is what was sent without the cache marker (moving a marker keeps the prefix)."""
    bare = {k: v for k, v in sent.items() if k != "cache_control"} if isinstance(sent, dict) else sent
    return Unit(chars, ttl is not None, assistant, bare, ttl)


def _text_of_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


@dataclass
class _Prompt:
    """What the validation collects while it walks a request, in prompt order."""

    units: list[Unit] = field(default_factory=list)
    tool_results: list[str] = field(default_factory=list)
    breakpoints: list[int] = field(default_factory=lambda: [0])  # cache_control blocks seen (at most 4)


def _check_top_level(body: Any) -> tuple[int, list[Any], bool]:
    """The body's keys, model, max_tokens, messages and stream; returns (max_tokens, messages, stream)."""
    require(isinstance(body, dict), "Request body must be a JSON object")
    extra = sorted(set(body) - ALLOWED_KEYS)
    require(
        not extra,
        f"{extra[0] if extra else ''}: Extra inputs are not permitted",
        param=extra[0] if extra else None,
    )
    require(is_str(body.get("model")) and body["model"], "model: Field required", param="model")
    max_tokens = body.get("max_tokens")
    require(
        isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1,
        "max_tokens: Field required (an integer >= 1)",
        param="max_tokens",
    )
    messages = body.get("messages")
    require(
        isinstance(messages, list) and len(messages) > 0,
        "messages: at least one message is required",
        param="messages",
    )
    stream = body.get("stream", False)
    require(isinstance(stream, bool), "stream: Input should be a valid boolean")
    return max_tokens, messages, stream


def _check_thinking(body: dict[str, Any], max_tokens: int) -> bool:
    """The thinking settings and the temperature they allow; returns whether thinking is on."""
    thinking_on = False
    thinking = body.get("thinking")
    if thinking is not None:
        require(
            isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled", "adaptive"),
            "thinking.type: Input should be 'enabled', 'disabled' or 'adaptive'",
            param="thinking",
        )
        if thinking["type"] == "enabled":
            budget = thinking.get("budget_tokens")
            require(
                isinstance(budget, int) and budget >= 1024,
                "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
            )
            require(
                max_tokens > budget,
                "`max_tokens` must be greater than `thinking.budget_tokens`. Please "
                "consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
                "#max-tokens-and-context-window-size",
            )
        thinking_on = thinking["type"] in ("enabled", "adaptive")
        if thinking_on and body.get("temperature") is not None:
            require(
                body["temperature"] == 1,
                "`temperature` may only be set to 1 when thinking is enabled or in adaptive mode.",
            )
    temperature = body.get("temperature")
    if temperature is not None:
        require(
            isinstance(temperature, int | float) and 0 <= temperature <= 1,
            "temperature: Input should be less than or equal to 1",
            param="temperature",
        )
    return thinking_on


def _check_tools(tools: Any, prompt: _Prompt) -> list[str]:
    """The tool definitions (names unique and well formed, object schemas); returns the names offered."""
    offered: list[str] = []
    if tools is None:
        return offered
    require(isinstance(tools, list), "tools: Input should be a valid list")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        require(isinstance(tool, dict), f"{where}: Input should be an object")
        name = tool.get("name")
        require(
            is_str(name) and bool(TOOL_NAME.match(name)),
            f"{where}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'",
        )
        require(name not in names, f"tools: Tool names must be unique. Duplicate: {name}")
        names.add(name)
        if tool.get("type") in (None, "custom"):
            schema = tool.get("input_schema")
            require(
                isinstance(schema, dict) and schema.get("type") == "object",
                f"{where}.custom.input_schema.type: Input should be 'object'",
            )
        bp = _check_cache_control(tool.get("cache_control"), where, prompt.breakpoints)
        prompt.units.append(_unit(tool_def_chars(name, tool.get("description"), tool.get("input_schema")), tool, bp))
        offered.append(name)
    return offered


def _check_system(system: Any, prompt: _Prompt) -> None:
    if system is None:
        return
    if isinstance(system, str):
        prompt.units.append(_unit(len(system), system, None))
        return
    require(isinstance(system, list), "system: Input should be a valid string or list")
    for i, block in enumerate(system):
        require(
            isinstance(block, dict) and block.get("type") == "text" and is_str(block.get("text")),
            f"system.{i}: Input should be a text block",
        )
        require(block["text"] != "", f"system.{i}: text content blocks must be non-empty")
        bp = _check_cache_control(block.get("cache_control"), f"system.{i}", prompt.breakpoints)
        prompt.units.append(_unit(len(block["text"]), block, bp))


def _message_blocks(content: Any, where: str, role: Any, is_last: bool) -> list[Any]:
    """A message's content as blocks; only a final assistant message (a prefill) may be empty."""
    if isinstance(content, str):
        require(
            content != "" or (role == "assistant" and is_last),
            f"{where}: all messages must have non-empty content except for the optional final assistant message",
        )
        return [{"type": "text", "text": content}] if content else []
    require(isinstance(content, list), f"{where}.content: Input should be a valid string or list")
    require(
        len(content) > 0 or (role == "assistant" and is_last),
        f"{where}: all messages must have non-empty content except for the optional final assistant message",
    )
    return content


def _check_answers(where: str, blocks: list[Any], pending: list[str]) -> None:
    """A user message answers every tool_use of the message before (and nothing else), results first."""
    answered = [b.get("tool_use_id") for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
    missing = [t for t in pending if t not in answered]
    if missing:
        raise _unanswered(where, missing)
    unexpected = [t for t in answered if t not in pending]
    if unexpected:
        raise RequestError(
            f"{where}.content: unexpected `tool_use_id` found in `tool_result` blocks: "
            f"{unexpected[0]}. Each `tool_result` block must have a corresponding `tool_use` block "
            "in the previous message."
        )
    if answered:
        seen_other = False
        for b in blocks:
            if b.get("type") == "tool_result":
                require(
                    not seen_other,
                    f"{where}: `tool_result` blocks must come first in the content "
                    "of a user message that answers tool calls",
                )
            else:
                seen_other = True


def _image_block(block: Any, bw: str) -> None:
    src = block.get("source")
    require(
        isinstance(src, dict) and src.get("type") in ("base64", "url", "file"),
        f"{bw}.source: Field required",
    )
    if src["type"] == "base64":
        require(
            src.get("media_type") in ("image/jpeg", "image/png", "image/gif", "image/webp"),
            f"{bw}.source.base64.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'",
        )
        require(is_str(src.get("data")), f"{bw}.source.base64.data: Field required")


def _tool_result_block(block: Any, bw: str, bp: str | None, prompt: _Prompt) -> None:
    require(is_str(block.get("tool_use_id")), f"{bw}.tool_use_id: Field required")
    inner = block.get("content", "")
    if isinstance(inner, list):
        for k, part in enumerate(inner):
            require(
                isinstance(part, dict) and part.get("type") in ("text", "image", "document", "search_result"),
                f"{bw}.content.{k}: Input should be a text or image block",
            )
            if part.get("type") == "text":
                require(
                    is_str(part.get("text")) and part["text"] != "",
                    f"{bw}.content.{k}: text content blocks must be non-empty",
                )
    else:
        require(is_str(inner), f"{bw}.content: Input should be a valid string or list")
    is_error = block.get("is_error")
    require(
        is_error is None or isinstance(is_error, bool),
        f"{bw}.is_error: Input should be a boolean",
    )
    text = _text_of_content(inner)
    images = sum(1 for p in inner if isinstance(p, dict) and p.get("type") == "image") if isinstance(inner, list) else 0
    prompt.units.append(_unit(len(text) + images * IMAGE_CHARS, block, bp))
    prompt.tool_results.append(unescape_tool_result(text))


def _thinking_block(block: Any, bw: str, bp: str | None) -> None:
    require(bp is None, f"{bw}: cache_control cannot be set on thinking blocks")
    require(is_str(block.get("thinking")), f"{bw}.thinking: Field required")
    require(is_str(block.get("signature")), f"{bw}.signature: Field required")
    require(
        signature_valid(block["thinking"], block["signature"]),
        f"{bw}: Invalid `signature` in `thinking` block",
    )


def _check_block(block: Any, bw: str, role: str, uses: list[str], prompt: _Prompt) -> None:
    """One content block of a message: allowed for its role and well formed; its size counted."""
    require(
        isinstance(block, dict) and is_str(block.get("type")),
        f"{bw}: Input should be a content block",
    )
    btype = block["type"]
    allowed = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
    require(btype in allowed, f"{bw}.type: '{btype}' blocks are not allowed in {role} messages")
    bp = _check_cache_control(block.get("cache_control"), bw, prompt.breakpoints)
    asst = role == "assistant"
    if btype == "text":
        require(is_str(block.get("text")), f"{bw}.text: Field required")
        require(block["text"] != "", f"{bw}: text content blocks must be non-empty")
        prompt.units.append(_unit(len(block["text"]), block, bp, asst))
        if role == "user":
            prompt.tool_results.extend(xml_tool_results(block["text"]))
    elif btype == "image":
        _image_block(block, bw)
        prompt.units.append(_unit(IMAGE_CHARS, block, bp, asst))
    elif btype == "tool_use":
        require(is_str(block.get("id")) and block["id"], f"{bw}.id: Field required")
        require(is_str(block.get("name")), f"{bw}.name: Field required")
        require(isinstance(block.get("input"), dict), f"{bw}.input: Input should be a valid dictionary")
        require(block["id"] not in uses, f"{bw}: `tool_use` ids must be unique")
        uses.append(block["id"])
        prompt.units.append(_unit(len(block["name"]) + args_chars(block["input"]), block, bp, asst))
    elif btype == "tool_result":
        _tool_result_block(block, bw, bp, prompt)
    elif btype == "thinking":
        _thinking_block(block, bw, bp)
    elif btype == "redacted_thinking":
        require(
            is_str(block.get("data")) and redacted_valid(block["data"]),
            f"{bw}: Invalid `data` in `redacted_thinking` block",
        )


def _check_thinking_leads(where: str, blocks: list[Any]) -> None:
    """With thinking on, the assistant message of an open tool loop starts with its thinking block."""
    first = blocks[0].get("type") if blocks else None
    require(
        first in ("thinking", "redacted_thinking"),
        f"{where}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        f"`{first}`. When `thinking` is enabled, a final `assistant` message must start with a "
        "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
        "recommend you include thinking blocks from previous turns. To avoid this requirement, "
        "disable `thinking`.",
    )


def _check_messages(messages: list[Any], thinking_on: bool, prompt: _Prompt) -> int:
    """Roles, content blocks and the tool loop of every message; returns how many assistant turns came before."""
    assistants = 0
    require(
        messages[0].get("role") == "user" if isinstance(messages[0], dict) else False,
        'messages: first message must use the "user" role',
    )
    pending: list[str] = []  # tool_use ids of the previous assistant message, to be answered now
    for i, msg in enumerate(messages):
        where = f"messages.{i}"
        require(isinstance(msg, dict), f"{where}: Input should be an object")
        role = msg.get("role")
        require(role in ("user", "assistant"), f"{where}.role: Input should be 'user' or 'assistant'")
        blocks = _message_blocks(msg.get("content"), where, role, i == len(messages) - 1)
        if role == "user":
            _check_answers(where, blocks, pending)
            pending = []
        elif pending:
            raise _unanswered(where, pending)
        else:
            assistants += 1
        uses: list[str] = []
        for j, block in enumerate(blocks):
            _check_block(block, f"{where}.content.{j}", role, uses, prompt)
        if role == "assistant":
            pending = uses
            open_loop = bool(uses) and i >= len(messages) - 2
            if thinking_on and open_loop:
                _check_thinking_leads(where, blocks)
    if pending:
        raise _unanswered(f"messages.{len(messages)}", pending)
    return assistants


def _automatic_breakpoint(cc: Any, prompt: _Prompt) -> None:
    """The top-level ``cache_control`` (automatic caching) puts a breakpoint on the last cacheable block."""
    if cc is None or not prompt.units or prompt.units[-1].breakpoint:
        return
    ttl = _check_cache_control(cc, "cache_control", prompt.breakpoints)
    last = prompt.units[-1]
    prompt.units[-1] = Unit(last.chars, True, last.assistant, last.content, ttl)


def parse_request(body: Any) -> ParsedRequest:
    max_tokens, messages, stream = _check_top_level(body)
    thinking_on = _check_thinking(body, max_tokens)
    prompt = _Prompt()
    offered = _check_tools(body.get("tools"), prompt)
    _check_system(body.get("system"), prompt)
    assistants = _check_messages(messages, thinking_on, prompt)
    _automatic_breakpoint(body.get("cache_control"), prompt)
    breakpoint_ttls(prompt.units)
    last_role = messages[-1].get("role")
    # An assistant message at the end is a prefill: the reply continues it, it is not a new turn.
    turn = assistants + 1 - (1 if last_role == "assistant" else 0)
    return ParsedRequest(
        model=body["model"],
        turn=max(turn, 1),
        tool_results=prompt.tool_results,
        units=prompt.units,
        stream=stream,
        tools_offered=offered,
        thinking=thinking_on,
        body=body,
    )


def _content(plan: Plan) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if plan.thinking is not None:
        blocks.append({"type": "thinking", "thinking": plan.thinking, "signature": plan.signature})
    if plan.redacted_thinking is not None:
        blocks.append({"type": "redacted_thinking", "data": plan.redacted_thinking})
    if plan.text:
        blocks.append({"type": "text", "text": plan.text})
    for call in plan.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.input})
    return blocks


def _stop_reason(plan: Plan) -> str:
    return plan.stop_reason if plan.stop_reason in STOP_REASONS else "end_turn"


def _usage(plan: Plan, *, output_tokens: int) -> dict[str, Any]:
    cache = plan.cache  # from what was sent and what the emulator's cache held (prompt_cache.py)
    return {
        # Anthropic's input_tokens excludes what was read from or written to the cache.
        "input_tokens": cache.uncached,
        "cache_creation_input_tokens": cache.written,
        "cache_read_input_tokens": cache.read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": cache.written - cache.written_1h,
            "ephemeral_1h_input_tokens": cache.written_1h,
        },
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def message_json(plan: Plan, parsed: ParsedRequest | None = None) -> dict[str, Any]:
    return {
        "id": plan.ident("msg_"),
        "type": "message",
        "role": "assistant",
        "model": plan.model,
        "content": _content(plan),
        "stop_reason": _stop_reason(plan),
        "stop_sequence": None,
        "usage": _usage(plan, output_tokens=plan.output_tokens),
    }


def message_events(plan: Plan, parsed: ParsedRequest | None = None) -> list[tuple[str | None, Any]]:
    """The SSE events of the same message, in the order the real API sends them."""
    start = message_json(plan)
    start.update(content=[], stop_reason=None, stop_sequence=None, usage=_usage(plan, output_tokens=1))
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(_content(plan)):
        btype = block["type"]
        if btype == "thinking":
            first: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p} for p in chunks(block["thinking"])]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif btype == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in chunks(block["text"])]
        elif btype == "tool_use":
            first = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": p}
                for p in chunks(json.dumps(block["input"], ensure_ascii=False), 12)
            ]
        else:  # redacted_thinking arrives whole in its start event
            first, deltas = block, []
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": first}))
        for delta in deltas:
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    final_usage = _usage(plan, output_tokens=plan.output_tokens)
    final_usage.pop("service_tier")
    final_usage.pop("cache_creation")
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop_reason(plan), "stop_sequence": None},
                "usage": final_usage,  # cumulative, as the real API reports it
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events
