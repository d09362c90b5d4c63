"""mark_cache: place Anthropic prompt-cache breakpoints where they pay, so each turn reads what the last one wrote.

Anthropic caches the prefix (tools, system, messages) up to each ``cache_control`` breakpoint, at most four,
and finds an earlier entry only within 20 blocks before a breakpoint
(https://docs.claude.com/en/docs/build-with-claude/prompt-caching). The breakpoints, by what they pay for:

1. the last block of the last user message: this turn's whole prompt is written, for the next turn to read;
2. the last block of the previous turn's last user message (the user message before the latest assistant
   message), when this turn added 20 blocks or more since (many parallel tool results): the lookback from
   the first breakpoint cannot reach what the previous turn wrote, this one reads it;
3. the last system block: tools and system, the prefix every compacted history keeps;
4. the last tool definition: the tools alone, read when only the system prompt changes.

``breakpoints`` (``provider.cache.breakpoints``, 1-4) keeps the first that many. A breakpoint on a prefix that
is already cached costs nothing: it is read, not written again. Where the second is not needed the markers are
the ones flowllm always placed, so saved runs still replay exactly.
"""

from __future__ import annotations

from typing import Any

from flowllm.core.types import Block, Message, ToolSpec
from flowllm.engine import Node, TurnContext
from flowllm.errors import ConfigError

CACHE_TTLS = ("5m", "1h")
MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20  # Anthropic checks for a cache hit up to 20 blocks before a breakpoint


def check_cache_settings(ttl: str, breakpoints: int) -> None:
    """Refuse a TTL or a breakpoint count Anthropic does not accept, naming the allowed values."""
    if ttl not in CACHE_TTLS:
        raise ConfigError(f"provider.cache.ttl must be '5m' or '1h' (Anthropic's cache TTLs), not '{ttl}'")
    check_breakpoints(breakpoints)


def check_breakpoints(breakpoints: int) -> None:
    if isinstance(breakpoints, bool) or not isinstance(breakpoints, int) or not 1 <= breakpoints <= MAX_BREAKPOINTS:
        raise ConfigError(
            f"provider.cache.breakpoints must be 1, 2, 3 or 4 (Anthropic accepts at most 4), not {breakpoints!r}"
        )


def _mark_last(blocks: list[Block], marker: dict[str, Any]) -> list[Block]:
    if not blocks:
        return blocks
    marked = list(blocks)
    marked[-1] = {**blocks[-1], "cache_control": dict(marker)}
    return marked


def _user_breakpoints(messages: list[Message]) -> list[int]:
    """The last user message, then the previous turn's (the user message before the latest assistant message)
    when the blocks since are beyond the lookback of the last one."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user" and m["content"]]
    if not users:
        return []
    last = users[-1]
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i < last]
    previous = [i for i in users if assistants and i < assistants[-1]]
    if not previous:
        return [last]
    since = sum(len(m["content"]) for m in messages[previous[-1] + 1 : last + 1])
    return [last, previous[-1]] if since >= LOOKBACK_BLOCKS else [last]


class MarkCache(Node):
    """(request_messages, system, tools) -> (prompt_messages, prompt_system, prompt_tools).

    Breakpoints only when the provider supports cache control. Copies what it marks; the history itself never
    carries cache markers, so moving breakpoints turn after turn cannot pile up more than the API allows.
    """

    outputs = ("prompt_messages", "prompt_system", "prompt_tools")

    def __init__(self, enabled: bool = True, ttl: str = "5m", breakpoints: int = MAX_BREAKPOINTS) -> None:
        check_cache_settings(ttl, breakpoints)
        self.enabled = enabled
        self.breakpoints = breakpoints
        self.marker: dict[str, Any] = {"type": "ephemeral"}
        if ttl == "1h":
            self.marker["ttl"] = "1h"

    def run(
        self, ctx: TurnContext, request_messages: list[Message], system: list[Block], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        provider = ctx.provider
        if not (self.enabled and provider is not None and provider.supports_cache_control):
            return {"prompt_messages": request_messages, "prompt_system": system, "prompt_tools": tools}
        wanted: list[tuple[str, int]] = [("message", i) for i in _user_breakpoints(request_messages)]
        if system:
            wanted.append(("system", 0))
        if tools:
            wanted.append(("tools", 0))
        chosen = wanted[: self.breakpoints]
        messages = list(request_messages)
        for kind, i in chosen:
            if kind == "message":
                messages[i] = {**messages[i], "content": _mark_last(messages[i]["content"], self.marker)}
        marked_tools = list(tools)
        if ("tools", 0) in chosen:
            marked_tools[-1] = {**marked_tools[-1], "cache_control": dict(self.marker)}
        return {
            "prompt_messages": messages,
            "prompt_system": _mark_last(system, self.marker) if ("system", 0) in chosen else system,
            "prompt_tools": marked_tools,
        }
