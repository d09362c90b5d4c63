"""Media blocks a model cannot take, described in text: what it was, its size and dimensions or duration, a
content hash, and where the original is kept.

Pure functions on canonical messages, shared by every provider (``BaseProvider.sendable`` applies them to its
own request for the media it does not accept) and the ``degrade_media`` node (``flowllm.nodes.media``), which
records the replacements.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Any

from flowllm.core.types import Block, Message


def image_size(data_b64: str) -> tuple[int, int] | None:
    """(width, height) of a base64 PNG, GIF or JPEG, read from its header; None when not recognised."""
    try:
        head = base64.b64decode(data_b64[:65536] + "=" * (-len(data_b64[:65536]) % 4), validate=False)
    except ValueError:
        return None
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        width, height = struct.unpack(">II", head[16:24])
        return int(width), int(height)
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        width, height = struct.unpack("<HH", head[6:10])
        return int(width), int(height)
    if head[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(head):
            if head[i] != 0xFF:
                i += 1
                continue
            marker = head[i + 1]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", head[i + 5 : i + 9])
                return int(width), int(height)
            (length,) = struct.unpack(">H", head[i + 2 : i + 4])
            i += 2 + length
    return None


MEDIA_TYPES = ("image", "audio", "document", "file")


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
