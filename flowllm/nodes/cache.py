"""mark_cache: place Anthropic prompt-cache breakpoints on the system prompt and the last user message."""

from __future__ import annotations

from typing import Any

from flowllm.core.types import Block, Message, ToolSpec
from flowllm.engine import Node, TurnContext
from flowllm.errors import ConfigError


def _mark_last(blocks: list[Block], marker: dict[str, Any]) -> list[Block]:
    if not blocks:
        return blocks
    marked = list(blocks)
    marked[-1] = {**blocks[-1], "cache_control": dict(marker)}
    return marked


class MarkCache(Node):
    """(request_messages, system, tools) -> (prompt_messages, prompt_system, prompt_tools).

    Breakpoints go on the system prompt, the last tool definition and the last user message, only when the
    provider supports cache control.

    Copies what it marks; the history itself never carries cache markers, so moving breakpoints turn after
    turn cannot pile up more than the API allows.
    """

    outputs = ("prompt_messages", "prompt_system", "prompt_tools")

    def __init__(self, enabled: bool = True, ttl: str = "5m") -> None:
        if ttl not in ("5m", "1h"):
            raise ConfigError(f"cache ttl must be '5m' or '1h', not '{ttl}'")
        self.enabled = enabled
        self.marker: dict[str, Any] = {"type": "ephemeral"}
        if ttl == "1h":
            self.marker["ttl"] = "1h"

    def run(
        self, ctx: TurnContext, request_messages: list[Message], system: list[Block], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        provider = ctx.provider
        if not (self.enabled and provider is not None and provider.supports_cache_control):
            return {"prompt_messages": request_messages, "prompt_system": system, "prompt_tools": tools}
        messages = list(request_messages)
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] == "user":
                messages[i] = {**messages[i], "content": _mark_last(messages[i]["content"], self.marker)}
                break
        marked_tools = list(tools)
        if marked_tools:
            marked_tools[-1] = {**marked_tools[-1], "cache_control": dict(self.marker)}
        return {
            "prompt_messages": messages,
            "prompt_system": _mark_last(system, self.marker),
            "prompt_tools": marked_tools,
        }
