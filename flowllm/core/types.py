"""Provider-neutral data that flows between the nodes of a turn.

Two kinds of data live here:

* The **canonical history**: plain JSON-shaped dicts (``Message`` and content ``Block`` typed dicts). They are
  what the recorder writes and what replay reads back, so they stay plain JSON: no classes to rebuild.
  The shape follows Anthropic's content blocks because they are the richest of the three wire formats;
  every provider translates them both ways.
* The **results of a stage**: frozen-ish dataclasses (``Usage``, ``ModelResponse``, ``ToolResult``) with
  ``to_dict``/``from_dict`` so they round-trip through ``output.json``.

Canonical blocks (``type`` decides the other keys):

    {"type": "text", "text": str, "cache_control"?: {...}}
    {"type": "image", "media_type": str, "data": str (base64)}
    {"type": "tool_use", "id": str, "name": str, "input": dict}
    {"type": "tool_result", "tool_use_id": str, "content": list[text|image block], "is_error": bool}
    {"type": "thinking", "thinking": str, "signature": str}
    {"type": "redacted_thinking", "data": str}
    {"type": "reasoning", "id": str, "summary": list, "encrypted_content": str | None}   # OpenAI Responses

A ``Message`` is ``{"role": "user" | "assistant", "content": list[Block]}``. The system prompt travels
separately as a list of text blocks, because only some protocols put it in the message list.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal, NotRequired, TypedDict

Role = Literal["user", "assistant"]


class Block(TypedDict, total=False):
    type: str
    text: str
    cache_control: dict[str, Any]
    media_type: str
    data: str
    id: str
    name: str
    input: dict[str, Any]
    tool_use_id: str
    content: list[Block]
    is_error: bool
    thinking: str
    signature: str
    summary: list[Any]
    encrypted_content: str | None
    # OpenAI protocols: a tool_use's arguments exactly as the model wrote them, when they differ from
    # json.dumps(input) (unparsable, or other spacing), so the next request sends back what the model said.
    arguments_text: str
    # A tool_use whose id flowllm chose (provider.history.portable_ids): the id the server gave the call.
    server_id: str


class Message(TypedDict):
    role: Role
    content: list[Block]
    # Free-form annotations that are never sent to a provider (e.g. which turn produced the message).
    meta: NotRequired[dict[str, Any]]


class ToolSpec(TypedDict):
    """A tool as offered to the model: ``server`` groups tools (MCP server name), ``name`` is the tool."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    # Set by mark_cache on the last tool (Anthropic's tool-definitions breakpoint), for the native protocol.
    cache_control: NotRequired[dict[str, Any]]
    # The server's `instructions` (capped), on the first tool of each server: part of the tool manual.
    server_instructions: NotRequired[str]


def text_block(text: str) -> Block:
    return {"type": "text", "text": text}


def user_message(text: str) -> Message:
    return {"role": "user", "content": [text_block(text)]}


# The counts of ``Usage`` in the order its records have always listed them.
USAGE_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")


class Usage:
    """Token counts of one model call: input counts every prompt token, cached or not.

    ``input_tokens`` counts every prompt token, cached or not; ``cache_read_tokens`` and
    ``cache_write_tokens`` are the parts of it read from and written to the cache. ``reasoning_tokens`` is the
    part of ``output_tokens`` spent thinking. ``estimated`` marks counts we computed because the server gave none.
    ``cache_write_1h_tokens`` is the part of ``cache_write_tokens`` written with Anthropic's one-hour TTL,
    billed at its own price (flowllm/spend/pricing.py).

    Not a dataclass on purpose: orjson writes a dataclass field by field, so every saved node output would gain
    the one-hour count and no longer equal what runs made before it saved. Serialisers call ``to_dict``
    instead (the recorder's ``default``), which writes that count only when there is one.
    """

    __slots__ = (*USAGE_COUNTS, "estimated", "cache_write_1h_tokens")

    def __init__(
        self,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated: bool = False,
        cache_write_1h_tokens: int = 0,
    ) -> None:
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cache_read_tokens = cache_read_tokens
        self.cache_write_tokens = cache_write_tokens
        self.reasoning_tokens = reasoning_tokens
        self.estimated = estimated
        self.cache_write_1h_tokens = cache_write_1h_tokens

    def _key(self) -> tuple[int | bool, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return self._key() == other._key() if isinstance(other, Usage) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaced

    def __repr__(self) -> str:
        return f"Usage({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            estimated=self.estimated or other.estimated,
            cache_write_1h_tokens=self.cache_write_1h_tokens + other.cache_write_1h_tokens,
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        # Spelled out rather than a loop over the names: this runs on every call.
        data: dict[str, Any] = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "estimated": self.estimated,
        }
        if self.cache_write_1h_tokens:  # only when there are any: every other call keeps its saved form
            data["cache_write_1h_tokens"] = self.cache_write_1h_tokens
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Usage:
        if not data:
            return cls()
        return cls(**{k: v for k, v in data.items() if k in cls.__slots__})


@dataclass
class NativeToolCall:
    """A tool call the provider returned in its structured form (not parsed from text)."""

    id: str
    name: str
    arguments: str  # the JSON text exactly as the provider sent it (Anthropic's dict is dumped to text)


@dataclass
class ModelResponse:
    """One model reply, the same whichever wire protocol produced it."""

    text: str
    stop_reason: str | None
    content_blocks: list[Block] = field(default_factory=list)
    tool_calls: list[NativeToolCall] = field(default_factory=list)
    thinking: str = ""
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    id: str = ""

    def to_message(self) -> Message:
        """The assistant message to append to the history: content blocks replayed verbatim."""
        if self.content_blocks:
            return {"role": "assistant", "content": [dict(b) for b in self.content_blocks]}  # type: ignore[misc]
        return {"role": "assistant", "content": [text_block(self.text)]}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "text": self.text,
            "stop_reason": self.stop_reason,
            "thinking": self.thinking,
            "tool_calls": [asdict(c) for c in self.tool_calls],
            "content_blocks": self.content_blocks,
            "usage": self.usage.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelResponse:
        return cls(
            id=data.get("id", ""),
            model=data.get("model", ""),
            text=data.get("text", ""),
            stop_reason=data.get("stop_reason"),
            thinking=data.get("thinking", ""),
            tool_calls=[NativeToolCall(**c) for c in data.get("tool_calls", [])],
            content_blocks=list(data.get("content_blocks", [])),
            usage=Usage.from_dict(data.get("usage")),
        )


class InfraCause(StrEnum):
    """Why a tool call failed for a reason that is not the model's: counted apart from the model's bad calls."""

    # The server is disabled or did not start, or the tool cannot work here (a library it needs does not import).
    UNAVAILABLE = "unavailable"
    SERVER_LOST = "server_lost"  # the server crashed, stopped answering or cannot be reached
    PROTOCOL = "protocol"  # the server broke the protocol
    SANDBOX = "sandbox"  # run_python's sandbox could not be set up


@dataclass
class ToolResult:
    """The outcome of one tool call, ready to go back to the model."""

    call_id: str
    server: str | None
    name: str
    content: str
    is_error: bool = False
    images: list[Block] = field(default_factory=list)
    # The result's text and image blocks in the server's order, when it mixed them (else empty: content, images).
    parts: list[Block] = field(default_factory=list)
    structured: Any = None  # the tool's structuredContent, kept as sent
    progress: list[dict[str, Any]] = field(default_factory=list)  # the server's progress notifications
    infra: InfraCause | None = None  # set when the call failed for an infrastructure reason, not the model's

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("parts", "structured", "progress", "infra"):  # absent when unused: older records unchanged
            if not data[key]:
                del data[key]
        if self.infra is not None:
            data["infra"] = self.infra.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolResult:
        infra = data.get("infra")
        return cls(**{**data, "infra": InfraCause(infra) if infra else None})
