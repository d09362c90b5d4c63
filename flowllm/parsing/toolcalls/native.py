"""Tool calls that arrive structured: OpenAI Chat ``tool_calls`` lists (dicts or SDK objects), OpenAI Responses
``function_call`` items (one, a list, or a whole response with ``output``), Anthropic ``tool_use`` blocks and
our own ``NativeToolCall``. Provider ids are kept; a missing id gets ``call_<n>``.
"""

from __future__ import annotations

from typing import Any

from flowllm.parsing.toolcalls.base import RawCall, arguments_to_text, dumps


def _plain(obj: Any) -> Any:
    """SDK objects (pydantic models) and dataclasses as plain dicts."""
    if isinstance(obj, dict | list | str) or obj is None:
        return obj
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump()
    if hasattr(obj, "__dataclass_fields__"):
        return {k: getattr(obj, k) for k in obj.__dataclass_fields__}
    return obj


def _args_text(args: Any) -> str:
    if isinstance(args, str):
        return args  # as the provider sent it: repair_arguments reads it and records how
    return dumps(args) if args is not None else "{}"


def native_item(item: Any) -> tuple[RawCall | None, str | None]:
    """One structured call as a RawCall, or a reason it is not one (None, None: not a call at all)."""
    d = _plain(item)
    if not isinstance(d, dict):
        return None, f"not a tool call: {type(item).__name__}"
    kind = d.get("type")
    if kind in ("message", "reasoning", "text", "thinking", "output_text"):
        return None, None
    if isinstance(d.get("function"), dict):  # Chat Completions
        fn = d["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            return None, "tool call without a function name"
        return RawCall(name, _args_text(fn.get("arguments")), None, d.get("id") or None), None
    if kind == "tool_use" or ("input" in d and "name" in d):  # Anthropic content block
        return RawCall(str(d.get("name", "")), dumps(d.get("input") or {}), None, d.get("id") or None), None
    if kind in ("function_call", "custom_tool_call") or ("call_id" in d and "name" in d):  # Responses
        args = d.get("arguments", d.get("input"))
        return RawCall(str(d.get("name", "")), _args_text(args), None, d.get("call_id") or d.get("id")), None
    if "name" in d and "arguments" in d:  # NativeToolCall and look-alikes
        return RawCall(str(d["name"]), _args_text(d["arguments"]), None, d.get("id") or None), None
    if "name" in d:
        return RawCall(str(d["name"]), arguments_to_text(d.get("parameters")), None, d.get("id") or None), None
    return None, f"unrecognised tool call item with keys {sorted(d)[:6]}"


def native_items(payload: Any) -> list[Any]:
    """The call items in a structured payload."""
    d = _plain(payload)
    if isinstance(d, dict):
        if isinstance(d.get("output"), list):  # a whole Responses response
            return list(d["output"])
        if isinstance(d.get("tool_calls"), list):  # a Chat message
            return list(d["tool_calls"])
        return [payload]
    if isinstance(d, list | tuple):
        return list(d)
    return [payload]
