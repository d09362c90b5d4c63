"""trim_history: keep the context small by blanking old tool results (the request's view only)."""

from __future__ import annotations

import copy
from typing import Any

from flowllm.core.types import Block, Message
from flowllm.engine import Node, TurnContext

PLACEHOLDER = "Tool result is omitted to save tokens."


def is_tool_result_message(message: Message) -> bool:
    if message.get("meta", {}).get("kind") == "tool_results":
        return True
    return message["role"] == "user" and any(b.get("type") == "tool_result" for b in message["content"])


def _blank(block: Block) -> Block:
    if block.get("type") == "tool_result":
        return {**block, "content": [{"type": "text", "text": PLACEHOLDER}]}
    if block.get("type") == "text":
        return {**block, "text": PLACEHOLDER}
    return copy.deepcopy(block)


def trim_tool_results(messages: list[Message], keep: int) -> list[Message]:
    """Replace the content of all but the last ``keep`` tool-result messages with a placeholder.

    The first user message (the task) is never touched, and blocks keep their type and ids, so every
    tool_use still has its tool_result and the request stays valid for every protocol. ``keep < 0`` keeps all.
    """
    if keep < 0:
        return messages
    positions = [i for i, m in enumerate(messages) if i > 0 and is_tool_result_message(m)]
    old = positions[: max(len(positions) - keep, 0)]
    if not old:
        return messages
    trimmed = list(messages)
    for i in old:
        message = messages[i]
        blanked: Message = {"role": message["role"], "content": [_blank(b) for b in message["content"]]}
        if "meta" in message:
            blanked["meta"] = {**message["meta"], "trimmed": True}
        trimmed[i] = blanked
    return trimmed


class TrimHistory(Node):
    """messages -> request_messages, with tool results older than the last ``keep_tool_result`` blanked."""

    outputs = ("request_messages",)

    def __init__(self, keep_tool_result: int = -1) -> None:
        self.keep_tool_result = keep_tool_result

    def run(self, ctx: TurnContext, messages: list[Message]) -> dict[str, Any]:
        return {"request_messages": trim_tool_results(messages, self.keep_tool_result)}
