"""Protocol-neutral parts of the emulator: what a request boils down to, and the reply plan.

Each wire module validates its request and reduces it to a ``ParsedRequest`` (turn, tool results, prompt
units), then ``plan_reply`` turns the scripted ``Reply`` into a ``Plan`` with deterministic ids and usage, and
the wire module encodes the plan as JSON or SSE. Keeping the arithmetic here makes the three protocols report
the same counts for the same conversation.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from flowllm.emulator.script import Reply

# Fixed so that replies are byte-identical across reruns (no wall clock anywhere).
FIXED_CREATED = 1_767_225_600  # 2026-01-01T00:00:00Z
IMAGE_CHARS = 1600  # an image counts as ~400 tokens, whatever its size
# Request keys that only choose the transport; hashing without them gives streamed and plain calls the same
# ids.
TRANSPORT_KEYS = frozenset({"stream", "stream_options"})

# The engine's xml protocol puts tool results into user text like this (content escapes </tool_result>).
XML_TOOL_RESULT = re.compile(r"<tool_result\b[^>]*>\n?(.*?)\n?</tool_result>", re.DOTALL)


class RequestError(Exception):
    """A request the real API would refuse: answered with ``status`` in that API's error shape."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type
        self.param = param
        self.code = code


@dataclass
class Unit:
    """One countable piece of the prompt, in prompt order (tools, system, then messages)."""

    chars: int
    breakpoint: bool = False  # carries an Anthropic cache_control
    assistant: bool = False  # part of an assistant turn
    content: Any = None  # what was sent (without its cache_control): a changed unit changes the cached prefix
    cache_ttl: str | None = None  # the breakpoint's TTL ("5m" or "1h")


@dataclass(frozen=True)
class CacheUsage:
    """One request's prompt: its tokens, and how many of them were read from and written to the cache."""

    prompt_tokens: int = 0
    read: int = 0
    written: int = 0
    written_1h: int = 0  # the part of ``written`` under a one-hour TTL (Anthropic bills it at 2x)

    @property
    def uncached(self) -> int:
        return self.prompt_tokens - self.read - self.written


@dataclass
class ParsedRequest:
    model: str
    turn: int
    tool_results: list[str]
    units: list[Unit]
    stream: bool
    tools_offered: list[str] = field(default_factory=list)
    thinking: bool = False
    include_usage: bool = False
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlannedCall:
    id: str
    name: str
    input: dict[str, Any]
    arguments: str  # the JSON text the OpenAI protocols send


@dataclass
class Plan:
    seed: str
    model: str
    text: str
    thinking: str | None
    signature: str
    redacted_thinking: str | None
    tool_calls: list[PlannedCall]
    stop_reason: str
    prompt_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cache: CacheUsage  # what the prompt read from and wrote to the emulator's cache (prompt_cache.py)
    turn: int

    def ident(self, prefix: str, n: int = 24, salt: str = "") -> str:
        return prefix + hashlib.sha256(f"{self.seed}:{prefix}:{salt}".encode()).hexdigest()[:n]


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def tokens(chars: int) -> int:
    return math.ceil(chars / 4) if chars > 0 else 0


def unescape_tool_result(text: str) -> str:
    return text.replace("&lt;", "<")


def xml_tool_results(text: str) -> list[str]:
    return [unescape_tool_result(m.group(1)) for m in XML_TOOL_RESULT.finditer(text)]


def args_chars(arguments: Any) -> int:
    """Characters of tool-call arguments, independent of the protocol's key order or spacing."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return len(arguments)
    return len(json.dumps(arguments, sort_keys=True, ensure_ascii=False))


def tool_def_chars(name: str, description: str | None, schema: Any) -> int:
    return len(name) + len(description or "") + len(json.dumps(schema or {}, sort_keys=True))


# ----- thinking signatures
# -------------------------------------------------------------------------------------
# The emulator signs what it emits and checks it when it comes back, like the real APIs do: a client that
# edits,
# drops or reorders thinking gets the 400 a paid run would get.
_SIG_PREFIX = b"flowllm-emulator-thinking\x00"
_ENC_PREFIX = "flowllm-emulator-reasoning:"
_REDACTED_PREFIX = "flowllm-emulator-redacted:"


def thinking_signature(thinking: str) -> str:
    return base64.b64encode(_SIG_PREFIX + hashlib.sha256(thinking.encode()).digest()).decode()


def signature_valid(thinking: str, signature: str) -> bool:
    return signature == thinking_signature(thinking)


def encrypted_reasoning(thinking: str) -> str:
    digest = hashlib.sha256(thinking.encode()).hexdigest()[:16]
    return base64.b64encode(f"{_ENC_PREFIX}{digest}:{thinking}".encode()).decode()


def decrypt_reasoning(blob: str) -> str | None:
    try:
        text = base64.b64decode(blob.encode(), validate=True).decode()
    except ValueError:
        return None
    if not text.startswith(_ENC_PREFIX):
        return None
    digest, _, thinking = text[len(_ENC_PREFIX) :].partition(":")
    return thinking if hashlib.sha256(thinking.encode()).hexdigest()[:16] == digest else None


def redacted_data(text: str) -> str:
    return base64.b64encode((_REDACTED_PREFIX + text).encode()).decode()


def redacted_valid(data: str) -> bool:
    try:
        return base64.b64decode(data.encode(), validate=True).decode().startswith(_REDACTED_PREFIX)
    except ValueError:
        return False


def plan_reply(parsed: ParsedRequest, reply: Reply, *, call_prefix: str, cache: CacheUsage | None = None) -> Plan:
    """Ids, signatures and usage for ``reply`` to ``parsed``, all derived from hashes (never random, never
    time)."""
    stable = {k: v for k, v in parsed.body.items() if k not in TRANSPORT_KEYS}
    seed = hashlib.sha256((canonical_json(stable) + "\x00" + canonical_json(reply.to_dict())).encode()).hexdigest()
    # A model cannot call tools it was not offered: scripted native calls only go out when tools were sent.
    calls = reply.tool_calls if parsed.tools_offered else ()
    # With thinking on, real models always think: an entry without thinking still yields an (empty) thinking
    # block / reasoning item, which also exercises the empty-thinking round trip.
    thinking = (reply.thinking or "") if parsed.thinking else None
    redacted = reply.redacted_thinking if parsed.thinking else None
    planned = [
        PlannedCall(
            id=call_prefix + hashlib.sha256(f"{seed}:call:{i}".encode()).hexdigest()[:24],
            name=c.name,
            input=c.input,
            arguments=json.dumps(c.input, ensure_ascii=False),
        )
        for i, c in enumerate(calls)
    ]
    stop = reply.stop_reason
    if stop == "tool_use" and not planned:
        stop = "end_turn"
    total = sum(u.chars for u in parsed.units)
    think_chars = len(thinking or "")
    out_chars = len(reply.text) + think_chars + sum(len(c.name) + args_chars(c.input) for c in planned)
    return Plan(
        seed=seed,
        model=parsed.model,
        text=reply.text,
        thinking=thinking,
        signature=thinking_signature(thinking) if thinking is not None else "",
        redacted_thinking=redacted_data(redacted) if redacted is not None else None,
        tool_calls=planned,
        stop_reason=stop,
        prompt_tokens=tokens(total),
        output_tokens=max(tokens(out_chars), 1),
        reasoning_tokens=tokens(think_chars),
        cache=cache if cache is not None else CacheUsage(prompt_tokens=tokens(total)),
        turn=parsed.turn,
    )


def chunks(text: str, size: int = 16) -> list[str]:
    """Deterministic delta pieces for SSE (at least one, even for empty text)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def require(cond: bool, message: str, *, param: str | None = None) -> None:
    if not cond:
        raise RequestError(message, param=param)


def is_str(value: Any) -> bool:
    return isinstance(value, str)


def request_image_digests(body: Any) -> list[str]:
    """The SHA-256 (hex) of every base64 image in a request body, in order, whatever the protocol: Anthropic's
    ``{"type": "base64", "media_type": "image/...", "data": ...}`` sources and OpenAI's ``data:image/...`` URLs."""
    found: list[str] = []

    def digest(data: str) -> str:
        try:
            raw = base64.b64decode(data, validate=False)
        except (ValueError, TypeError):
            raw = data.encode("utf-8", "replace")
        return hashlib.sha256(raw).hexdigest()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            media = value.get("media_type")
            if value.get("type") == "base64" and isinstance(media, str) and media.startswith("image/"):
                if isinstance(value.get("data"), str):
                    found.append(digest(value["data"]))
                return
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and value.startswith("data:image/") and ";base64," in value[:80]:
            found.append(digest(value.split(",", 1)[1]))

    walk(body)
    return found
