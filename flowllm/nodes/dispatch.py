"""dispatch_tools: run the turn's tool calls and append the reply and the results to the history."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flowllm.core.types import Block, Message, ModelResponse, ToolResult
from flowllm.engine import Node, TurnContext
from flowllm.nodes.executed import executed_message
from flowllm.nodes.toolcalls import PreparedCall
from flowllm.parsing import BadToolCall
from flowllm.parsing.isolation import frame_native_result, neutralize_call_markup
from flowllm.tools.client.textproto import format_tool_result


def _error(call_id: str, server: str | None, name: str, message: str) -> ToolResult:
    return ToolResult(call_id=call_id, server=server, name=name, content=message, is_error=True)


def _text_results(results: list[ToolResult]) -> list[Block]:
    blocks: list[Block] = [
        {"type": "text", "text": format_tool_result(replace(r, content=neutralize_call_markup(r.content)))}
        for r in results
    ]
    blocks.extend(image for r in results for image in r.images)
    return blocks


def results_message(results: list[ToolResult], native: bool, answered: list[str] | None = None) -> Message:
    """The user message that carries tool results back, in the form the tool protocol expects.

    ``answered``: (native) the ids of the calls the assistant message holds; a result for any other call (an
    unreadable one) goes as text after the tool results, since no ``tool_use`` carries its id."""
    blocks: list[Block]
    if native:
        blocks = []
        loose = [r for r in results if answered is not None and r.call_id not in answered]
        for r in results:
            if answered is not None and r.call_id not in answered:
                continue
            # The server's order when it mixed text and images (each text part framed as data); else the text,
            # then the images.
            content: list[Block] = [
                {**part, "text": frame_native_result(part["text"])} if part.get("type") == "text" else part
                for part in r.parts
            ] or [{"type": "text", "text": frame_native_result(r.content)}, *r.images]
            blocks.append({"type": "tool_result", "tool_use_id": r.call_id, "content": content, "is_error": r.is_error})
        blocks.extend(_text_results(loose))
    else:
        blocks = _text_results(results)
    return {
        "role": "user",
        "content": blocks,
        "meta": {"kind": "tool_results", "calls": [{"server": r.server, "tool": r.name} for r in results]},
    }


class DispatchTools(Node):
    """(messages, response, prepared_calls, bad_tool_calls) -> (tool_results, next_messages).

    Calls run through ``ctx.map``: one by one under the serial runners, together under graph_parallel, each
    with its timeout. Anything that goes wrong (arguments that could not be parsed, an unreadable call block,
    an unknown tool, a timeout) becomes an error result the model can read and act on; the turn goes on.
    """

    outputs = ("tool_results", "next_messages")

    def __init__(self, call_timeout_s: float = 60.0, task_state: bool = False) -> None:
        self.call_timeout_s = call_timeout_s
        # tools.task_state: hand the task's key-value store (flowllm/tools/state.py) to the backend, which
        # passes it on to the tools that ask for it.
        self.task_state = task_state

    async def run(
        self,
        ctx: TurnContext,
        messages: list[Message],
        response: ModelResponse,
        prepared_calls: list[PreparedCall],
        bad_tool_calls: list[BadToolCall],
    ) -> dict[str, Any]:
        tools = ctx.tools
        extra: dict[str, Any] = {}
        # ToolBackend.call declares `state`; a backend without a store (task_state None) is passed nothing.
        store = tools.task_state if self.task_state and tools is not None else None
        if store is not None:
            extra["state"] = store

        async def execute(p: PreparedCall) -> ToolResult:
            c = p.call
            if p.arguments is None:
                return _error(
                    c.id,
                    c.server,
                    c.name,
                    f"Could not parse your arguments: {p.error}. Send the call again with valid JSON arguments.",
                )
            if tools is None:
                return _error(c.id, c.server, c.name, "No tools are available now; answer without calling tools.")
            return await tools.call(c.server, c.name, p.arguments, call_id=c.id, timeout_s=self.call_timeout_s, **extra)

        # Each tool layer enforces its own limit (the pool: call_timeout_s; a sub-agent: its timeout_s); the
        # runner's item and turn timeouts are the outer safety net.
        outcomes = await ctx.map(execute, prepared_calls)
        results: list[ToolResult] = []
        for p, outcome in zip(prepared_calls, outcomes, strict=True):
            if isinstance(outcome, ToolResult):
                results.append(outcome)
            else:
                results.append(_error(p.call.id, p.call.server, p.call.name, f"Tool call failed: {outcome}"))
        for i, bad in enumerate(bad_tool_calls):
            results.append(
                _error(
                    f"bad_{i}",
                    None,
                    "unreadable_tool_call",
                    f"Your tool call could not be read ({bad.reason}). Use the documented format.",
                )
            )
        # The history holds what was executed (repaired arguments), so the next request is one every server's
        # chat template accepts (flowllm/nodes/executed.py).
        reply, answered = executed_message(response, prepared_calls)
        history = [*messages, reply]
        if results:
            native = bool(response.tool_calls)
            history.append(results_message(results, native=native, answered=answered if native else None))
        return {"tool_results": results, "next_messages": history}
