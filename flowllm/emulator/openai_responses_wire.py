"""The OpenAI Responses protocol, server side: validation, ``response`` JSON and typed SSE events.

Validation covers what a stateless client can get wrong: every ``function_call_output`` matching an earlier
``function_call`` and every call answered, reasoning items that carry (valid) ``encrypted_content`` when
nothing is stored server-side, and, with reasoning on, the reasoning item still in front of the function calls
of the open tool loop.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
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
    decrypt_reasoning,
    encrypted_reasoning,
    is_str,
    require,
    tool_def_chars,
    unescape_tool_result,
    xml_tool_results,
)
from flowllm.emulator.openai_chat_wire import _no_cache_control
from flowllm.emulator.openai_chat_wire import error_body as error_body

ALLOWED_KEYS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "include",
        "store",
        "stream",
        "stream_options",
        "metadata",
        "text",
        "truncation",
        "user",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "previous_response_id",
        "max_tool_calls",
        "background",
        "top_logprobs",
        "conversation",
        "prompt",
        "context_management",
    }
)
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
USER_PARTS = ("input_text", "input_image", "input_file")
ASSISTANT_PARTS = ("output_text", "refusal")


@dataclass
class _Walk:
    """What the validation collects while it walks the input items, and the assistant turns it has seen: a turn
    is a maximal run of assistant-side items (messages, function calls, reasoning)."""

    units: list[Unit] = field(default_factory=list)
    tool_results: list[str] = field(default_factory=list)
    calls: dict[str, bool] = field(default_factory=dict)  # call_id -> answered
    runs: int = 0
    in_run: bool = False
    run_has_reasoning: bool = False
    run_calls: list[str] = field(default_factory=list)
    last_run_calls: list[str] = field(default_factory=list)
    last_run_reasoning: bool = False

    def step(self, assistant_side: bool) -> None:
        """An item: it starts an assistant turn, or ends one, or goes on with what is under way."""
        if assistant_side and not self.in_run:
            self.runs += 1
            self.in_run, self.run_has_reasoning, self.run_calls = True, False, []
        elif not assistant_side and self.in_run:
            self.in_run = False
            self.last_run_calls, self.last_run_reasoning = self.run_calls, self.run_has_reasoning

    def finish(self) -> None:
        if self.in_run:
            self.last_run_calls, self.last_run_reasoning = self.run_calls, self.run_has_reasoning


def _check_settings(body: Any) -> tuple[bool, Any, bool]:
    """The body's keys, model, stream, limits, include and reasoning; returns (stream, store, thinking)."""
    require(isinstance(body, dict), "We could not parse the JSON body of your request.")
    extra = sorted(set(body) - ALLOWED_KEYS)
    if extra:
        raise RequestError(f"Unknown parameter: '{extra[0]}'.", param=extra[0], code="unknown_parameter")
    require(is_str(body.get("model")) and body["model"], "Missing required parameter: 'model'.", param="model")
    stream = body.get("stream", False)
    require(isinstance(stream, bool), "Invalid type for 'stream': expected a boolean", param="stream")
    max_out = body.get("max_output_tokens")
    require(
        max_out is None or (isinstance(max_out, int) and max_out >= 16),
        "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16.",
        param="max_output_tokens",
    )
    store = body.get("store", True)
    include = body.get("include") or []
    require(
        isinstance(include, list) and all(is_str(x) for x in include),
        "Invalid type for 'include'",
        param="include",
    )
    reasoning = body.get("reasoning")
    if reasoning is not None:
        require(
            isinstance(reasoning, dict)
            and reasoning.get("effort", "medium") in ("none", "minimal", "low", "medium", "high"),
            "Invalid value for 'reasoning.effort'.",
            param="reasoning.effort",
        )
    thinking = isinstance(reasoning, dict) and reasoning.get("effort", "medium") not in ("none", "minimal")
    return stream, store, thinking


def _check_tools(body: Any, units: list[Unit]) -> list[str]:
    """Function tools only, with well-formed names and parameters; returns the names offered."""
    offered: list[str] = []
    for i, tool in enumerate(body.get("tools") or []):
        require(
            isinstance(tool, dict) and tool.get("type") == "function",
            f"Invalid value for 'tools[{i}].type'.",
            param=f"tools[{i}].type",
        )
        name = tool.get("name")
        require(
            is_str(name) and bool(TOOL_NAME.match(name)),
            f"Invalid 'tools[{i}].name': string does not "
            "match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
            param=f"tools[{i}].name",
        )
        require(
            tool.get("parameters") is None or isinstance(tool.get("parameters"), dict),
            f"Invalid type for 'tools[{i}].parameters'",
            param=f"tools[{i}].parameters",
        )
        units.append(Unit(tool_def_chars(name, tool.get("description"), tool.get("parameters")), content=tool))
        offered.append(name)
    return offered


def _content_text(content: Any, where: str, role: Any) -> tuple[str, int]:
    """A message's text, its parts joined, and how many images it holds."""
    if isinstance(content, str):
        return content, 0
    allowed = ASSISTANT_PARTS if role == "assistant" else USER_PARTS
    require(isinstance(content, list), f"Invalid type for '{where}.content'", param=f"{where}.content")
    texts: list[str] = []
    images = 0
    for j, part in enumerate(content):
        pw = f"{where}.content[{j}]"
        ptype = part.get("type") if isinstance(part, dict) else None
        require(
            ptype in allowed,
            f"Invalid value: '{ptype}'. Supported values are: " + ", ".join(f"'{a}'" for a in allowed) + ".",
            param=f"{pw}.type",
        )
        if ptype in ("input_text", "output_text"):
            require(is_str(part.get("text")), f"Missing required parameter: '{pw}.text'.", param=pw)
            texts.append(part["text"])
        elif ptype == "input_image":
            require(
                is_str(part.get("image_url")) or is_str(part.get("file_id")),
                f"Missing required parameter: '{pw}.image_url'.",
                param=pw,
            )
            images += 1
        elif ptype == "refusal":
            texts.append(str(part.get("refusal", "")))
    return "\n".join(texts), images


def _message_item(item: Any, where: str, role: Any, walk: _Walk) -> None:
    require(
        role in ("user", "assistant", "system", "developer"),
        f"Invalid value: '{role}'. Supported values are: 'assistant', 'system', 'developer', and 'user'.",
        param=f"{where}.role",
    )
    text, images = _content_text(item.get("content"), where, role)
    walk.units.append(Unit(len(text) + images * IMAGE_CHARS, assistant=role == "assistant", content=item))
    if role == "user":
        walk.tool_results.extend(xml_tool_results(text))


def _function_call_item(item: Any, where: str, walk: _Walk) -> None:
    for key in ("call_id", "name", "arguments"):
        require(
            is_str(item.get(key)),
            f"Missing required parameter: '{where}.{key}'.",
            param=f"{where}.{key}",
        )
    require(item["call_id"] not in walk.calls, f"Duplicate call_id: {item['call_id']}", param=where)
    walk.calls[item["call_id"]] = False
    walk.run_calls.append(item["call_id"])
    walk.units.append(Unit(len(item["name"]) + args_chars(item["arguments"]), assistant=True, content=item))


def _function_call_output_item(item: Any, where: str, walk: _Walk) -> None:
    call_id = item.get("call_id")
    require(is_str(call_id), f"Missing required parameter: '{where}.call_id'.", param=f"{where}.call_id")
    require(
        call_id in walk.calls,
        f"No tool call found for function call output with call_id {call_id}.",
        param="input",
    )
    walk.calls[call_id] = True
    output = item.get("output")
    if isinstance(output, str):
        text = output
    else:
        text = "\n".join(p.get("text", "") for p in (output or []) if isinstance(p, dict))
    walk.units.append(Unit(len(text), content=item))
    walk.tool_results.append(unescape_tool_result(text))


def _reasoning_item(item: Any, where: str, store: Any, walk: _Walk) -> None:
    """A reasoning item: stored server-side (``store``) or carrying encrypted content this server can verify."""
    require(
        isinstance(item.get("summary"), list),
        f"Missing required parameter: '{where}.summary'.",
        param=f"{where}.summary",
    )
    blob = item.get("encrypted_content")
    if blob is None:
        require(
            store is not False,
            f"Item with id '{item.get('id', '')}' not found. Items are not "
            "persisted when `store` is set to false. Try again with `store` set to true, or pass "
            "the item's encrypted_content.",
            param="input",
        )
    else:
        require(
            is_str(blob) and decrypt_reasoning(blob) is not None,
            f"The encrypted content for item {item.get('id', where)} could not be verified.",
            param=f"{where}.encrypted_content",
        )
    walk.run_has_reasoning = True


def _check_items(items: list[Any], store: Any, walk: _Walk) -> None:
    for i, item in enumerate(items):
        where = f"input[{i}]"
        require(isinstance(item, dict), f"Invalid type for '{where}': expected an object", param=where)
        itype = item.get("type", "message")
        role = item.get("role")
        walk.step(itype in ("function_call", "reasoning") or (itype == "message" and role == "assistant"))
        if itype == "message":
            _message_item(item, where, role, walk)
        elif itype == "function_call":
            _function_call_item(item, where, walk)
        elif itype == "function_call_output":
            _function_call_output_item(item, where, walk)
        elif itype == "reasoning":
            _reasoning_item(item, where, store, walk)
        else:
            raise RequestError(f"Invalid value: '{itype}'.", param=f"{where}.type")
    walk.finish()


def _check_loop_closed(walk: _Walk, thinking: bool) -> None:
    """Every function call answered; with reasoning on, the open tool loop keeps its reasoning item."""
    unanswered = [c for c, done in walk.calls.items() if not done]
    if unanswered:
        raise RequestError(f"No tool output found for function call {unanswered[0]}.", param="input")
    if thinking and walk.last_run_calls and not walk.last_run_reasoning:
        raise RequestError(
            f"Item of type 'function_call' ({walk.last_run_calls[0]}) was provided without its required "
            "'reasoning' item: keep the reasoning items of the tool loop in the input.",
            param="input",
        )


def parse_request(body: Any) -> ParsedRequest:
    stream, store, thinking = _check_settings(body)
    _no_cache_control(body.get("input"), "input")
    _no_cache_control(body.get("tools"), "tools")
    walk = _Walk()
    offered = _check_tools(body, walk.units)
    instructions = body.get("instructions")
    if instructions is not None:
        require(is_str(instructions), "Invalid type for 'instructions': expected a string", param="instructions")
        walk.units.append(Unit(len(instructions), content=instructions))
    raw_input = body.get("input")
    require(raw_input is not None, "Missing required parameter: 'input'.", param="input")
    items = [{"type": "message", "role": "user", "content": raw_input}] if isinstance(raw_input, str) else raw_input
    require(isinstance(items, list), "Invalid type for 'input': expected a string or an array", param="input")
    _check_items(items, store, walk)
    _check_loop_closed(walk, thinking)
    last_assistant = walk.in_run and items and items[-1].get("type", "message") == "message"
    return ParsedRequest(
        model=body["model"],
        turn=max(walk.runs + 1 - (1 if last_assistant else 0), 1),
        tool_results=walk.tool_results,
        units=walk.units,
        stream=stream,
        tools_offered=offered,
        thinking=thinking,
        body=body,
    )


def _status(plan: Plan) -> tuple[str, dict[str, Any] | None]:
    if plan.stop_reason == "max_tokens":
        return "incomplete", {"reason": "max_output_tokens"}
    if plan.stop_reason == "refusal":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _items(plan: Plan, body: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if plan.thinking is not None:
        item: dict[str, Any] = {
            "id": plan.ident("rs_"),
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": plan.thinking}] if plan.thinking else [],
        }
        if "reasoning.encrypted_content" in (body.get("include") or []):
            item["encrypted_content"] = encrypted_reasoning(plan.thinking)
        items.append(item)
    if plan.text:
        items.append(
            {
                "id": plan.ident("msg_"),
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": plan.text, "annotations": [], "logprobs": []}],
            }
        )
    for i, call in enumerate(plan.tool_calls):
        items.append(
            {
                "id": plan.ident("fc_", salt=str(i)),
                "type": "function_call",
                "status": "completed",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
            }
        )
    return items


def _usage(plan: Plan) -> dict[str, Any]:
    return {
        "input_tokens": plan.prompt_tokens,  # includes the cached part
        "input_tokens_details": {"cached_tokens": plan.cache.read},  # prompt_cache.py
        "output_tokens": plan.output_tokens,
        "output_tokens_details": {"reasoning_tokens": plan.reasoning_tokens},
        "total_tokens": plan.prompt_tokens + plan.output_tokens,
    }


def _envelope(plan: Plan, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": plan.ident("resp_"),
        "object": "response",
        "created_at": FIXED_CREATED,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": plan.model,
        "output": [],
        "parallel_tool_calls": True,
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": None,
        "metadata": {},
    }


def response_json(plan: Plan, parsed: ParsedRequest) -> dict[str, Any]:
    body = parsed.body
    status, incomplete = _status(plan)
    out = _envelope(plan, body)
    out.update(status=status, incomplete_details=incomplete, output=_items(plan, body), usage=_usage(plan))
    return out


class _Events:
    """The stream's events in order, each numbered as it is added."""

    def __init__(self) -> None:
        self.events: list[tuple[str | None, Any]] = []

    def emit(self, etype: str, **fields: Any) -> None:
        self.events.append((etype, {"type": etype, "sequence_number": len(self.events), **fields}))


def _reasoning_events(out: _Events, index: int, item: dict[str, Any]) -> None:
    out.emit("response.output_item.added", output_index=index, item={**item, "summary": []})
    for s, part in enumerate(item["summary"]):
        where = {"item_id": item["id"], "output_index": index, "summary_index": s}
        out.emit("response.reasoning_summary_part.added", **where, part={"type": "summary_text", "text": ""})
        for piece in chunks(part["text"]):
            out.emit("response.reasoning_summary_text.delta", **where, delta=piece)
        out.emit("response.reasoning_summary_text.done", **where, text=part["text"])
        out.emit("response.reasoning_summary_part.done", **where, part=copy.deepcopy(part))


def _message_events(out: _Events, index: int, item: dict[str, Any]) -> None:
    out.emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
    part = item["content"][0]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    out.emit("response.content_part.added", **where, part={**part, "text": ""})
    for piece in chunks(part["text"]):
        out.emit("response.output_text.delta", **where, delta=piece, logprobs=[])
    out.emit("response.output_text.done", **where, text=part["text"], logprobs=[])
    out.emit("response.content_part.done", **where, part=copy.deepcopy(part))


def _call_events(out: _Events, index: int, item: dict[str, Any]) -> None:
    out.emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "arguments": ""})
    for piece in chunks(item["arguments"], 12):
        out.emit("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece)
    out.emit(
        "response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=item["arguments"]
    )


def response_events(plan: Plan, parsed: ParsedRequest) -> list[tuple[str | None, Any]]:
    out = _Events()
    start = _envelope(plan, parsed.body)
    out.emit("response.created", response=start)
    out.emit("response.in_progress", response=start)
    for index, item in enumerate(_items(plan, parsed.body)):
        if item["type"] == "reasoning":
            _reasoning_events(out, index, item)
        elif item["type"] == "message":
            _message_events(out, index, item)
        else:
            _call_events(out, index, item)
        out.emit("response.output_item.done", output_index=index, item=item)
    final = response_json(plan, parsed)
    out.emit("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
    return out.events
