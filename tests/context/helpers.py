"""Synthetic histories in the engine's canonical form, and an observer that keeps what nodes produced."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flowllm.core.types import Message
from flowllm.engine import BoundNode, TurnContext

BIG = "row,value\n" + "\n".join(f"{i},{i * i}" for i in range(300))  # ~3 KB of tool output


def native_history(turns: int, *, thinking: bool = True, big: str = BIG) -> list[Message]:
    """Task, then ``turns`` rounds of (assistant: thinking + tool_use, user: tool_result)."""
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "Sum the values."}]}]
    for t in range(turns):
        content: list[Any] = []
        if thinking:
            content.append({"type": "thinking", "thinking": f"turn {t}", "signature": f"sig{t}"})
        content.append({"type": "text", "text": f"Reading part {t}."})
        content.append({"type": "tool_use", "id": f"call_{t}", "name": "tool-files-read_file", "input": {"p": t}})
        messages.append({"role": "assistant", "content": content})
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"call_{t}",
                        "content": [{"type": "text", "text": f"part {t}\n{big}"}],
                        "is_error": False,
                    }
                ],
                "meta": {"kind": "tool_results", "calls": [{"server": "tool-files", "tool": "read_file"}]},
            }
        )
    return messages


def xml_history(turns: int, *, big: str = BIG) -> list[Message]:
    """The text protocol: calls in assistant text, results as user text blocks."""
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "Sum the values."}]}]
    for t in range(turns):
        call = (
            "<use_mcp_tool><server_name>tool-files</server_name><tool_name>read_file</tool_name>"
            f'<arguments>{{"p": {t}}}</arguments></use_mcp_tool>'
        )
        messages.append({"role": "assistant", "content": [{"type": "text", "text": call}]})
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": f'<tool_result server="tool-files" tool="read_file">\npart {t}\n{big}\n</tool_result>',
                    }
                ],
                "meta": {"kind": "tool_results", "calls": [{"server": "tool-files", "tool": "read_file"}]},
            }
        )
    return messages


def pairing_ok(messages: list[Message]) -> bool:
    """Every tool_use is answered by a tool_result in the next message, and roles alternate."""
    for i, message in enumerate(messages):
        if i and message["role"] == messages[i - 1]["role"]:
            return False
        uses = [b["id"] for b in message["content"] if b.get("type") == "tool_use"]
        if uses:
            if i + 1 >= len(messages):
                return False
            answered = {b.get("tool_use_id") for b in messages[i + 1]["content"] if b.get("type") == "tool_result"}
            if not set(uses) <= answered:
                return False
    return True


@dataclass
class Outputs:
    """A NodeObserver that keeps every node's outputs (and inputs) by (scope, turn, node)."""

    outputs: dict[tuple[str, int, str], Mapping[str, Any]] = field(default_factory=dict)
    inputs: dict[tuple[str, int, str], Mapping[str, Any]] = field(default_factory=dict)
    folders: dict[int, list[str]] = field(default_factory=dict)
    records_nodes: bool = True
    reads_meta: bool = False

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None:
        key = (ctx.agent, ctx.turn, node.name)
        self.inputs[key] = inputs
        if outputs is not None:
            self.outputs[key] = outputs
        if ctx.agent == "main":
            self.folders.setdefault(ctx.turn, []).append(node.folder)

    def turns(self, node: str, agent: str = "main") -> list[Mapping[str, Any]]:
        found = sorted((t, out) for (a, t, n), out in self.outputs.items() if a == agent and n == node)
        return [out for _, out in found]
