"""The OpenAI Responses protocol, server side: validation, ``response`` JSON and typed SSE events.

Validation covers what a stateless client can get wrong: every ``function_call_output`` matching an earlier
``function_call`` and every call answered, reasoning items that carry (valid) ``encrypted_content`` when
nothing is stored server-side, and, with reasoning on, the reasoning item still in front of the function calls
of the open tool loop.
"""

from __future__ import annotations

import copy
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


def parse_request(body: Any) -> ParsedRequest:
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
    _no_cache_control(body.get("input"), "input")
    _no_cache_control(body.get("tools"), "tools")

    units: list[Unit] = []
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
        units.append(Unit(tool_def_chars(name, tool.get("description"), tool.get("parameters"))))
        offered.append(name)
    instructions = body.get("instructions")
    if instructions is not None:
        require(is_str(instructions), "Invalid type for 'instructions': expected a string", param="instructions")
        units.append(Unit(len(instructions)))

    raw_input = body.get("input")
    require(raw_input is not None, "Missing required parameter: 'input'.", param="input")
    items = [{"type": "message", "role": "user", "content": raw_input}] if isinstance(raw_input, str) else raw_input
    require(isinstance(items, list), "Invalid type for 'input': expected a string or an array", param="input")

    tool_results: list[str] = []
    calls: dict[str, bool] = {}  # call_id -> answered
    runs = 0  # assistant turns: maximal runs of assistant-side items
    in_run = False
    run_has_reasoning = False
    run_calls: list[str] = []
    last_run_calls: list[str] = []
    last_run_reasoning = False
    for i, item in enumerate(items):
        where = f"input[{i}]"
        require(isinstance(item, dict), f"Invalid type for '{where}': expected an object", param=where)
        itype = item.get("type", "message")
        role = item.get("role")
        assistant_side = itype in ("function_call", "reasoning") or (itype == "message" and role == "assistant")
        if assistant_side and not in_run:
            runs += 1
            in_run, run_has_reasoning, run_calls = True, False, []
        elif not assistant_side and in_run:
            in_run = False
            last_run_calls, last_run_reasoning = run_calls, run_has_reasoning
        if itype == "message":
            require(
                role in ("user", "assistant", "system", "developer"),
                f"Invalid value: '{role}'. Supported values are: 'assistant', 'system', 'developer', and 'user'.",
                param=f"{where}.role",
            )
            content = item.get("content")
            allowed = ASSISTANT_PARTS if role == "assistant" else USER_PARTS
            if isinstance(content, str):
                text, images = content, 0
            else:
                require(isinstance(content, list), f"Invalid type for '{where}.content'", param=f"{where}.content")
                texts: list[str] = []
                images = 0
                for j, part in enumerate(content):
                    pw = f"{where}.content[{j}]"
                    ptype = part.get("type") if isinstance(part, dict) else None
                    require(
                        ptype in allowed,
                        f"Invalid value: '{ptype}'. Supported values are: "
                        + ", ".join(f"'{a}'" for a in allowed)
                        + ".",
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
                text = "\n".join(texts)
            units.append(Unit(len(text) + images * IMAGE_CHARS, assistant=role == "assistant"))
            if role == "user":
                tool_results.extend(xml_tool_results(text))
        elif itype == "function_call":
            for key in ("call_id", "name", "arguments"):
                require(
                    is_str(item.get(key)),
                    f"Missing required parameter: '{where}.{key}'.",
                    param=f"{where}.{key}",
                )
            require(item["call_id"] not in calls, f"Duplicate call_id: {item['call_id']}", param=where)
            calls[item["call_id"]] = False
            run_calls.append(item["call_id"])
            units.append(Unit(len(item["name"]) + args_chars(item["arguments"]), assistant=True))
        elif itype == "function_call_output":
            call_id = item.get("call_id")
            require(is_str(call_id), f"Missing required parameter: '{where}.call_id'.", param=f"{where}.call_id")
            require(
                call_id in calls,
                f"No tool call found for function call output with call_id {call_id}.",
                param="input",
            )
            calls[call_id] = True
            output = item.get("output")
            text = (
                output
                if isinstance(output, str)
                else "\n".join(p.get("text", "") for p in (output or []) if isinstance(p, dict))
            )
            units.append(Unit(len(text)))
            tool_results.append(unescape_tool_result(text))
        elif itype == "reasoning":
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
            run_has_reasoning = True
        else:
            raise RequestError(f"Invalid value: '{itype}'.", param=f"{where}.type")
    if in_run:
        last_run_calls, last_run_reasoning = run_calls, run_has_reasoning
    unanswered = [c for c, done in calls.items() if not done]
    if unanswered:
        raise RequestError(f"No tool output found for function call {unanswered[0]}.", param="input")
    if thinking and last_run_calls and not last_run_reasoning:
        raise RequestError(
            f"Item of type 'function_call' ({last_run_calls[0]}) was provided without its required "
            "'reasoning' item: keep the reasoning items of the tool loop in the input.",
            param="input",
        )
    last_assistant = in_run and items and items[-1].get("type", "message") == "message"
    return ParsedRequest(
        model=body["model"],
        turn=max(runs + 1 - (1 if last_assistant else 0), 1),
        tool_results=tool_results,
        units=units,
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
        "input_tokens_details": {"cached_tokens": plan.cached_tokens},
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


def response_events(plan: Plan, parsed: ParsedRequest) -> list[tuple[str | None, Any]]:
    body = parsed.body
    events: list[tuple[str | None, Any]] = []

    def emit(etype: str, **fields: Any) -> None:
        events.append((etype, {"type": etype, "sequence_number": len(events), **fields}))

    start = _envelope(plan, body)
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for index, item in enumerate(_items(plan, body)):
        itype = item["type"]
        if itype == "reasoning":
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
            for s, part in enumerate(item["summary"]):
                emit(
                    "response.reasoning_summary_part.added",
                    item_id=item["id"],
                    output_index=index,
                    summary_index=s,
                    part={"type": "summary_text", "text": ""},
                )
                for piece in chunks(part["text"]):
                    emit(
                        "response.reasoning_summary_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        summary_index=s,
                        delta=piece,
                    )
                emit(
                    "response.reasoning_summary_text.done",
                    item_id=item["id"],
                    output_index=index,
                    summary_index=s,
                    text=part["text"],
                )
                emit(
                    "response.reasoning_summary_part.done",
                    item_id=item["id"],
                    output_index=index,
                    summary_index=s,
                    part=copy.deepcopy(part),
                )
        elif itype == "message":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            part = item["content"][0]
            emit(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part={**part, "text": ""},
            )
            for piece in chunks(part["text"]):
                emit(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                )
            emit(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            emit(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=copy.deepcopy(part),
            )
        else:
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            for piece in chunks(item["arguments"], 12):
                emit(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=piece,
                )
            emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=index, item=item)
    final = response_json(plan, parsed)
    emit("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
    return events
