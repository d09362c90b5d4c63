"""parse_tool_calls and repair_arguments: from what the model wrote to calls with real argument dicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowllm.core.types import ModelResponse, ToolSpec
from flowllm.engine import Node, TurnContext
from flowllm.parsing import ToolCall, parse_tool_calls, repair_arguments, validate_formats, validate_stages


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

    def __init__(self, formats: list[str] | None = None) -> None:
        if formats:
            validate_formats(list(formats))
        self.formats = list(formats) if formats else None

    def run(self, ctx: TurnContext, response: ModelResponse, tools: list[ToolSpec]) -> dict[str, Any]:
        servers = sorted({t["server"] for t in tools}) or None
        if response.tool_calls:
            payload: Any = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in response.tool_calls
            ]
            parsed = parse_tool_calls(payload, servers=servers)
        else:
            parsed = parse_tool_calls(response.text, servers=servers, formats=self.formats)
        return {"tool_calls": list(parsed.calls), "bad_tool_calls": list(parsed.bad)}


class RepairArguments(Node):
    """tool_calls -> prepared_calls: each call's argument text through the configured repair stages."""

    outputs = ("prepared_calls",)

    def __init__(self, stages: list[str] | None = None) -> None:
        if stages is not None:
            validate_stages(list(stages))
        self.stages = list(stages) if stages is not None else None

    def run(self, ctx: TurnContext, tool_calls: list[ToolCall]) -> dict[str, Any]:
        prepared = []
        for call in tool_calls:
            repaired = repair_arguments(call.arguments_text, stages=self.stages)
            if repaired.ok:
                prepared.append(PreparedCall(call, repaired.value, repaired.stage))
            else:
                prepared.append(PreparedCall(call, None, None, repaired.error or "not valid JSON"))
        return {"prepared_calls": prepared}
