"""degrade_media: images, audio and other binary content reach a model only if it accepts them natively.

Tool results (and task attachments) may carry media blocks (``{"type": "image" | "audio" | "document" | "file",
"media_type": ..., "data": base64}``). A provider that accepts a kind gets it as is; for any other kind the
block becomes a text description: what it was, its size and dimensions or duration, a content hash, and where
the original is. Only the request is changed (this is a ``before_model`` hook): the history, and so the run's
artifacts (``dispatch_tools``' ``tool_results`` and ``next_messages``), keep every original byte.

What a provider accepts is asked of the provider: ``Provider.accepted_media`` (``provider.accepts`` in its
config minus ``text``, e.g. ``[text]`` for DeepSeek and most local models; wrappers such as the resilient chain
and replay declare their primary's). ``accept: [...]`` in the node's config overrides it, e.g. ``accept: []``
for a text-only model served over a protocol that could carry images.

No hook has to be switched on for a text-only model: every provider applies ``degrade_messages`` to its own
request for the media it does not accept (``BaseProvider.sendable``). Listing the hook as well records what was
replaced (its ``degraded`` output) and lets ``accept`` narrow it further:

    python -m flowllm 'pipeline.hooks.before_model=[degrade_media]'
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Any

from flowllm.core.interfaces import Provider
from flowllm.core.types import Block, Message
from flowllm.engine import Node, TurnContext
from flowllm.nodes.tokens import image_size

MEDIA_TYPES = ("image", "audio", "document", "file")


# What a turn without a provider (a pipeline tested on its own) is taken to accept: all three protocols carry images.
NO_PROVIDER_MEDIA = frozenset({"image"})


def accepted_media(provider: Provider | None, override: list[str] | None = None) -> set[str]:
    """The media block types ``provider`` takes natively (see the module doc)."""
    if override is not None:
        return {str(kind) for kind in override}
    return set(provider.accepted_media if provider is not None else NO_PROVIDER_MEDIA)


def _decoded(data: str) -> bytes:
    try:
        return base64.b64decode(data + "=" * (-len(data) % 4))
    except ValueError:
        return b""


def _wav_seconds(raw: bytes) -> float | None:
    if len(raw) < 44 or raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        return None
    (byte_rate,) = struct.unpack("<I", raw[28:32])
    return (len(raw) - 44) / byte_rate if byte_rate else None


def describe_media(block: Block, where: str) -> str:
    """A one-paragraph text stand-in for a media block the model cannot take."""
    kind = str(block.get("type", "file"))
    media_type = str(block.get("media_type") or "application/octet-stream")
    data = str(block.get("data", ""))
    raw = _decoded(data)
    details = [media_type, f"{len(raw) / 1024:.1f} KB"]
    if kind == "image":
        size = image_size(data)
        if size is not None:
            details.append(f"{size[0]}x{size[1]} pixels")
    elif kind == "audio":
        seconds = _wav_seconds(raw)
        if seconds is not None:
            details.append(f"{seconds:.1f} s")
    if block.get("name"):
        details.append(f"name {block['name']}")
    details.append(f"sha256 {hashlib.sha256(raw).hexdigest()[:16]}")
    return (
        f"[{kind} not shown: this model does not accept {kind} input ({', '.join(details)}). "
        f"The original is kept in the run's records ({where}).]"
    )


def degrade_messages(messages: list[Message], accepted: set[str]) -> tuple[list[Message], list[dict[str, Any]]]:
    """``messages`` with every media block of a kind not in ``accepted`` replaced by its description."""
    report: list[dict[str, Any]] = []
    out: list[Message] = []

    def convert(blocks: list[Block], where: str) -> tuple[list[Block], bool]:
        changed = False
        new: list[Block] = []
        for block in blocks:
            kind = block.get("type")
            if kind in MEDIA_TYPES and kind not in accepted:
                text = describe_media(block, where)
                new.append({"type": "text", "text": text})
                report.append({"where": where, "type": kind, "media_type": block.get("media_type"), "text": text})
                changed = True
            elif kind == "tool_result" and isinstance(block.get("content"), list):
                inner, inner_changed = convert(block["content"], f"{where}, tool call {block.get('tool_use_id')}")
                new.append({**block, "content": inner} if inner_changed else block)
                changed = changed or inner_changed
            else:
                new.append(block)
        return new, changed

    for i, message in enumerate(messages):
        meta = message.get("meta", {})
        where = f"message {i}" + (f", from turn {meta['turn']}" if "turn" in meta else "")
        blocks, changed = convert(message["content"], where)
        out.append({**message, "content": blocks} if changed else message)
    return out, report


class DegradeMedia(Node):
    """prompt_messages -> (prompt_messages, degraded): media the provider cannot take, as text."""

    outputs = ("prompt_messages", "degraded")

    def __init__(self, accept: list[str] | None = None) -> None:
        self.accept = list(accept) if accept is not None else None

    def run(self, ctx: TurnContext, prompt_messages: list[Message]) -> dict[str, Any]:
        accepted = accepted_media(ctx.provider, self.accept)
        messages, report = degrade_messages(prompt_messages, accepted)
        return {"prompt_messages": messages, "degraded": report}
