"""The seven-node turn graph with trivial nodes, and payloads the size of a real turn's.

The nodes have the names, inputs and outputs of ``conf/pipeline/agent_turn.yaml`` but do no work: each returns
the outputs it was built with. Whatever a runner spends on top of calling them is the engine's overhead. The
payloads are shaped like a second turn of the bundled sample (a task, a reply with a tool call, its result,
the tool manual in the system prompt, the raw Anthropic request and reply): about 50 KB of JSON over the turn's
21 recorded files, which is what the recorder's figure is for.
"""

from __future__ import annotations

import json
from typing import Any

from flowllm.core.types import Message, ModelResponse, ToolResult, ToolSpec, Usage, text_block
from flowllm.engine import Node, TurnContext, build_pipeline
from flowllm.engine.pipeline import Pipeline
from flowllm.nodes.toolcalls import PreparedCall
from flowllm.parsing import ToolCall

TURN_INPUTS = ("messages", "system", "tools")


class _Constant(Node):
    """Returns the same outputs every time (built once, so the benchmark times the engine, not the node)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = {k: values[k] for k in self.outputs}


class TrimHistory(_Constant):
    outputs = ("request_messages",)

    def run(self, ctx: TurnContext, messages: list[Message]) -> dict[str, Any]:
        return self.values


class MarkCache(_Constant):
    outputs = ("prompt_messages", "prompt_system", "prompt_tools")

    def run(
        self, ctx: TurnContext, request_messages: list[Message], system: list[Any], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        return self.values


class CallModel(_Constant):
    outputs = ("raw_request", "raw_response")

    def run(
        self, ctx: TurnContext, prompt_messages: list[Message], prompt_system: list[Any], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        return self.values


class Normalize(_Constant):
    outputs = ("response",)

    def run(self, ctx: TurnContext, raw_response: dict[str, Any]) -> dict[str, Any]:
        return self.values


class ParseToolCalls(_Constant):
    outputs = ("tool_calls", "bad_tool_calls")

    def run(self, ctx: TurnContext, response: ModelResponse, tools: list[ToolSpec]) -> dict[str, Any]:
        return self.values


class RepairArguments(_Constant):
    outputs = ("prepared_calls",)

    def run(self, ctx: TurnContext, tool_calls: list[ToolCall]) -> dict[str, Any]:
        return self.values


class DispatchTools(_Constant):
    outputs = ("tool_results", "next_messages")

    def run(
        self,
        ctx: TurnContext,
        messages: list[Message],
        response: ModelResponse,
        prepared_calls: list[PreparedCall],
        bad_tool_calls: list[Any],
    ) -> dict[str, Any]:
        return self.values


NODE_CLASSES: tuple[type[_Constant], ...] = (
    TrimHistory,
    MarkCache,
    CallModel,
    Normalize,
    ParseToolCalls,
    RepairArguments,
    DispatchTools,
)
NODE_NAMES = (
    "trim_history",
    "mark_cache",
    "call_model",
    "normalize",
    "parse_tool_calls",
    "repair_arguments",
    "dispatch_tools",
)

_CODE = (
    "import csv\ntotal = 0.0\nwith open('sales.csv', newline='') as fh:\n"
    "    for row in csv.DictReader(fh):\n        if row['region'] == 'North':\n"
    "            total += int(row['units']) * float(row['unit_price'])\nprint(f'{total:.2f}')"
)
_CSV = "\n".join(f"{i},North,widget-{i},{i % 7 + 1},{(i * 3.7) % 50:.2f}" for i in range(40))


def _tools() -> list[ToolSpec]:
    schema = {"type": "object", "properties": {"code": {"type": "string", "description": "Python source"}}}
    tools = (
        ("tool-python", "run_python", "Run Python code. "),
        ("tool-files", "read_file", "Read a file. "),
        ("tool-math", "calculate", "Evaluate arithmetic. "),
    )
    return [{"server": s, "name": n, "description": d * 12, "input_schema": schema} for s, n, d in tools]


def typical_turn() -> dict[str, Any]:
    """Every state key of a turn (inputs and outputs), sized like turn 2 of the bundled sample."""
    tools = _tools()
    system = [text_block("You are a careful assistant that solves tasks step by step. " * 8 + json.dumps(tools))]
    call_text = (
        "I'll compute the revenue with Python.\n\n<use_mcp_tool>\n<server_name>tool-python</server_name>\n"
        f"<tool_name>run_python</tool_name>\n<arguments>\n{json.dumps({'code': _CODE})}\n</arguments>\n"
        "</use_mcp_tool>"
    )
    messages: list[Message] = [
        {"role": "user", "content": [text_block("What is the revenue of the North region? " + _CSV[:300])]},
        {"role": "assistant", "content": [text_block(call_text)]},
        {"role": "user", "content": [text_block("Result of run_python:\n" + _CSV)], "meta": {"kind": "tool_results"}},
    ]
    usage = Usage(input_tokens=1190, output_tokens=140, cache_read_tokens=1100)
    reply = "The revenue is 5259.18. Let me check it.\n\n" + call_text.split("\n\n", 1)[1]
    response = ModelResponse(
        text=reply,
        stop_reason="end_turn",
        content_blocks=[text_block(reply)],
        usage=usage,
        model="flowllm-emulator",
        id="msg_55a12adabe59f15d95e4ab2f",
    )
    raw_request = {
        "model": "flowllm-emulator",
        "max_tokens": 4096,
        "system": [{**system[0], "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
    }
    raw_response = {
        "id": response.id,
        "type": "message",
        "role": "assistant",
        "model": "flowllm-emulator",
        "content": [{"type": "text", "text": reply}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 90, "output_tokens": 140, "cache_read_input_tokens": 1100},
    }
    call = ToolCall(id="call_0", server="tool-python", name="run_python", arguments_text=json.dumps({"code": _CODE}))
    prepared = [PreparedCall(call, {"code": _CODE}, "strict")]
    results = [ToolResult(call_id="call_0", server="tool-python", name="run_python", content="5259.18")]
    return {
        "messages": messages,
        "system": system,
        "tools": tools,
        "request_messages": messages,
        "prompt_messages": messages,
        "prompt_system": raw_request["system"],
        "prompt_tools": tools,
        "raw_request": raw_request,
        "raw_response": raw_response,
        "response": response,
        "tool_calls": [call],
        "bad_tool_calls": [],
        "prepared_calls": prepared,
        "tool_results": results,
        "next_messages": [*messages, response.to_message()],
    }


def trivial_nodes(values: dict[str, Any] | None = None) -> list[_Constant]:
    values = values if values is not None else typical_turn()
    return [cls(values) for cls in NODE_CLASSES]


def trivial_pipeline(values: dict[str, Any] | None = None) -> Pipeline:
    """The seven trivial nodes wired by flowllm's own graph building (the objects passed as ``_target_``)."""
    nodes = trivial_nodes(values)
    return build_pipeline(
        {name: {"_target_": node} for name, node in zip(NODE_NAMES, nodes, strict=True)},
        provided=TURN_INPUTS,
        source="benchmarks/turn_fixture.py",
    )


def turn_inputs(values: dict[str, Any]) -> dict[str, Any]:
    return {k: values[k] for k in TURN_INPUTS}
