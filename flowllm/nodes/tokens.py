"""Counting a request's tokens: the provider's own count when the last call reported one, else an estimate.

No tokenizer ships with flowllm (they differ per model and most need a download), so estimates are a
deterministic stand-in that errs on the high side: about 3.5 characters per token for text and JSON, a small
overhead per message and block, and a fixed price per image (Anthropic's ``width x height / 750``, capped).
Erring high keeps a budget honest: trimming a little early costs a little context, trimming late costs a 400.

When the usage of the previous call is known, ``count_context`` starts from it: the provider counted that
request and the reply exactly (``input_tokens + output_tokens``); only the difference between that request and
the candidate is estimated. Every count says which parts were estimated (``TokenCount``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from flowllm.core.media import image_size
from flowllm.core.types import Block, Message, ToolSpec, Usage

CHARS_PER_TOKEN = 3.5
MESSAGE_OVERHEAD = 4  # role markers and separators around each message
BLOCK_OVERHEAD = 3  # per content block / tool definition framing
IMAGE_TOKENS_MAX = 1600  # Anthropic's cap for one image after resizing; OpenAI "high" detail is similar
MEDIA_TOKENS_DEFAULT = 1600  # an image we cannot measure, or another binary attachment


def text_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0


def media_tokens(block: Block) -> int:
    if block.get("type") == "image":
        size = image_size(str(block.get("data", "")))
        if size is not None:
            width, height = size
            return max(1, min(IMAGE_TOKENS_MAX, math.ceil(width * height / 750)))
    return MEDIA_TOKENS_DEFAULT


def block_tokens(block: Block) -> int:
    kind = block.get("type")
    if kind == "text":
        return BLOCK_OVERHEAD + text_tokens(str(block.get("text", "")))
    if kind == "tool_use":
        args = block.get("arguments_text") or json.dumps(block.get("input", {}), ensure_ascii=False)
        return BLOCK_OVERHEAD + text_tokens(str(block.get("name", "")) + str(block.get("id", "")) + args)
    if kind == "tool_result":
        content = block.get("content", [])
        if isinstance(content, str):
            return BLOCK_OVERHEAD + text_tokens(content)
        return BLOCK_OVERHEAD + text_tokens(str(block.get("tool_use_id", ""))) + sum(block_tokens(b) for b in content)
    if kind == "thinking":
        # The signature travels back too, but providers do not bill it as prompt text.
        return BLOCK_OVERHEAD + text_tokens(str(block.get("thinking", "")))
    if kind == "redacted_thinking":
        return BLOCK_OVERHEAD + text_tokens(str(block.get("data", ""))) // 4
    if kind == "reasoning":
        summary = json.dumps(block.get("summary", []), ensure_ascii=False)
        return BLOCK_OVERHEAD + text_tokens(summary) + text_tokens(str(block.get("encrypted_content") or "")) // 4
    if kind in ("image", "audio", "document", "file"):
        return BLOCK_OVERHEAD + media_tokens(block)
    return BLOCK_OVERHEAD + text_tokens(json.dumps(block, ensure_ascii=False, default=str))


def message_tokens(message: Message) -> int:
    return MESSAGE_OVERHEAD + sum(block_tokens(b) for b in message["content"])


def tool_tokens(tool: ToolSpec) -> int:
    schema = json.dumps(tool.get("input_schema", {}), ensure_ascii=False, sort_keys=True)
    return BLOCK_OVERHEAD + text_tokens(tool["server"] + tool["name"] + tool.get("description", "") + schema)


def estimate_request(system: list[Block], messages: list[Message], tools: list[ToolSpec]) -> int:
    """The estimated prompt tokens of a request (system prompt, tool definitions, messages)."""
    return (
        sum(block_tokens(b) for b in system)
        + sum(tool_tokens(t) for t in tools)
        + sum(message_tokens(m) for m in messages)
    )


@dataclass
class TokenCount:
    """A request's size and how it was obtained; recorded next to every budget decision."""

    tokens: int
    source: str  # "provider_usage" (the last call's count plus an estimated difference) | "estimate"
    provider_tokens: int = 0  # the part the provider counted
    estimated_tokens: int = 0  # the part estimated here (may be negative: what trimming removed)

    @property
    def estimated(self) -> bool:
        return self.source == "estimate"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "estimated": self.estimated}


def last_assistant_index(messages: list[Message]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            return i
    return None


def usable_usage(usage: Usage | dict[str, Any] | None) -> Usage | None:
    """The last call's usage, when the provider really reported it (an estimated usage is no better than ours)."""
    if usage is None:
        return None
    if isinstance(usage, dict):
        usage = Usage.from_dict(usage)
    if usage.estimated or usage.input_tokens <= 0:
        return None
    return usage


def count_context(
    system: list[Block],
    messages: list[Message],
    tools: list[ToolSpec],
    last_usage: Usage | None,
    sent_before: Callable[[list[Message]], list[Message]] | None = None,
) -> TokenCount:
    """Tokens of the request ``(system, messages, tools)``.

    With a known ``last_usage``: the previous request plus its reply, as the provider counted them, plus the
    estimated difference between that request and this one. The previous request was the history up to the
    last assistant message, as ``sent_before`` shapes it (trimming; identity when None).
    """
    estimate = estimate_request(system, messages, tools)
    usage = usable_usage(last_usage)
    last = last_assistant_index(messages)
    if usage is None or last is None:
        return TokenCount(tokens=estimate, source="estimate", estimated_tokens=estimate)
    prefix = messages[:last]
    sent = sent_before(prefix) if sent_before is not None else prefix
    reference = estimate_request(system, [*sent, messages[last]], tools)
    known = usage.input_tokens + usage.output_tokens
    delta = estimate - reference
    return TokenCount(
        tokens=max(known + delta, 0), source="provider_usage", provider_tokens=known, estimated_tokens=delta
    )
