"""parse_tool_calls and repair_arguments: from what the model wrote to calls with real argument dicts.

Both nodes are async so that parsing never holds the event loop: a reply of more than ``OFF_LOOP_CHARS``
characters is parsed (and its arguments repaired) in a worker thread, while the other tasks go on and the
task's own timeout can still cancel it. Below that, a thread would cost more than the parse. Every stage is
linear in its input and ``max_chars`` caps the input (beyond it, a bad call or failed repair that says so),
so a worker thread left running by a cancelled task finishes soon after on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from flowllm.core.types import ModelResponse, ToolSpec
from flowllm.engine import Node, TurnContext
from flowllm.errors import ConfigError
from flowllm.parsing import ToolCall, parse_tool_calls, repair_arguments, validate_formats, validate_stages
from flowllm.parsing.safety import DEFAULT_MAX_CHARS

# Text below this is parsed on the loop: microseconds, cheaper than a thread hand-off.
OFF_LOOP_CHARS = 16_384

T = TypeVar("T")


async def run_parsing(size: int, fn: Callable[[], T]) -> T:
    """``fn()`` inline for small inputs, in a worker thread (awaited, so cancellable) for large ones."""
    if size <= OFF_LOOP_CHARS:
        return fn()
    return await asyncio.to_thread(fn)


def _check_limit(max_chars: int | None) -> int | None:
    if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1):
        raise ConfigError(f"max_chars must be a positive number of characters or null, got {max_chars!r}")
    return max_chars


@dataclass
class PreparedCall:
    """A parsed call and the outcome of repairing its arguments."""

    call: ToolCall
    arguments: dict[str, Any] | None
    repair_stage: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.arguments is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "call": self.call.to_dict(),
            "arguments": self.arguments,
            "repair_stage": self.repair_stage,
            "error": self.error,
        }


class ParseToolCalls(Node):
    """response -> (tool_calls, bad_tool_calls): native calls when the provider returned some, else the text."""

    outputs = ("tool_calls", "bad_tool_calls")

    def __init__(self, formats: list[str] | None = None, max_chars: int | None = DEFAULT_MAX_CHARS) -> None:
        if formats:
            validate_formats(list(formats))
        self.formats = list(formats) if formats else None
        self.max_chars = _check_limit(max_chars)

    async def run(self, ctx: TurnContext, response: ModelResponse, tools: list[ToolSpec]) -> dict[str, Any]:
        servers = sorted({t["server"] for t in tools}) or None
        if response.tool_calls:
            payload: Any = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in response.tool_calls
            ]
            size = sum(len(c.arguments) if isinstance(c.arguments, str) else 0 for c in response.tool_calls)
            parsed = await run_parsing(size, lambda: parse_tool_calls(payload, servers=servers))
        else:
            text = response.text
            parsed = await run_parsing(
                len(text),
                lambda: parse_tool_calls(text, servers=servers, formats=self.formats, max_chars=self.max_chars),
            )
        return {"tool_calls": list(parsed.calls), "bad_tool_calls": list(parsed.bad)}


class RepairArguments(Node):
    """tool_calls -> prepared_calls: each call's argument text through the configured repair stages."""

    outputs = ("prepared_calls",)

    def __init__(self, stages: list[str] | None = None, max_chars: int | None = DEFAULT_MAX_CHARS) -> None:
        if stages is not None:
            validate_stages(list(stages))
        self.stages = list(stages) if stages is not None else None
        self.max_chars = _check_limit(max_chars)

    async def run(self, ctx: TurnContext, tool_calls: list[ToolCall]) -> dict[str, Any]:
        size = sum(len(c.arguments_text) for c in tool_calls)
        return {"prepared_calls": await run_parsing(size, lambda: self._prepare(tool_calls))}

    def _prepare(self, tool_calls: list[ToolCall]) -> list[PreparedCall]:
        prepared = []
        for call in tool_calls:
            repaired = repair_arguments(call.arguments_text, stages=self.stages, max_chars=self.max_chars)
            if repaired.ok:
                prepared.append(PreparedCall(call, repaired.value, repaired.stage))
            else:
                prepared.append(PreparedCall(call, None, None, repaired.error or "not valid JSON"))
        return prepared
