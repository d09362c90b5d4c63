"""Media in artifacts, stored once per run: ``<run>/blobs/<sha256>.<ext>``, referenced from every record.

An image a tool returned travels in every later message history, so inlined it would be written into each
later node's ``input.json`` and ``output.json`` (ten copies in a two-turn task). ``BlobStore.externalize``
turns each media block ``{"type": "image", "media_type": ..., "data": <base64>}`` into
``{"type": "image", "media_type": ..., "blob": "blobs/<sha256>.png", "bytes": n, "width": w, "height": h}``
and writes the bytes the first time their hash is seen. The reference is relative to the run directory, so a
run folder moved elsewhere still holds its media. ``inline`` restores the base64 for a reader that needs it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

BLOBS_DIR = "blobs"
_MEDIA_TYPES = frozenset({"image", "audio", "document"})
_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "audio/wav": "wav",
    "audio/mpeg": "mp3",
    "application/pdf": "pdf",
}


def extension(media_type: str) -> str:
    return _EXTENSIONS.get(media_type, media_type.rsplit("/", 1)[-1].replace("+", "_") or "bin")


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG, GIF or JPEG from its header; None when it cannot be read cheaply."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return int(width), int(height)
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                return None
            marker, length = data[i + 1], struct.unpack(">H", data[i + 2 : i + 4])[0]
            if marker in (0xC0, 0xC1, 0xC2):
                height, width = struct.unpack(">HH", data[i + 5 : i + 9])
                return int(width), int(height)
            i += 2 + length
    return None


def _is_media(value: dict[str, Any]) -> bool:
    return value.get("type") in _MEDIA_TYPES and isinstance(value.get("data"), str) and "media_type" in value


class BlobStore:
    """Content-addressed media files of one run; ``write`` is how the bytes reach the disk (the recorder's
    background writer), called once per distinct blob."""

    def __init__(self, run_dir: Path, write: Callable[[str, str, bytes], None] | None) -> None:
        """``write=None``: compute the references only (how a record of this value reads), write nothing."""
        self.run_dir = Path(run_dir)
        self._write = write
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def _store(self, block: dict[str, Any]) -> dict[str, Any]:
        try:
            raw = base64.b64decode(block["data"], validate=True)
        except (binascii.Error, ValueError):
            return block  # not base64: leave it as it came, nothing is lost
        digest = hashlib.sha256(raw).hexdigest()
        name = f"{digest}.{extension(str(block['media_type']))}"
        with self._lock:
            new = name not in self._known
            self._known.add(name)
        if new and self._write is not None and not (self.run_dir / BLOBS_DIR / name).exists():
            self._write(str(self.run_dir / BLOBS_DIR), name, raw)
        ref = {k: v for k, v in block.items() if k != "data"}
        ref.update(blob=f"{BLOBS_DIR}/{name}", bytes=len(raw))
        size = image_size(raw) if block.get("type") == "image" else None
        if size is not None:
            ref["width"], ref["height"] = size
        return ref

    def serialize(self, value: Any, dumps: Callable[[Any], bytes]) -> bytes:
        """``dumps(value)``, with inline media moved to blobs when there is any: how a record holds ``value``."""
        data = dumps(value)
        if b'"media_type"' in data and b'"data"' in data:
            data = dumps(self.externalize(value))
        return data

    def externalize(self, value: Any) -> Any:
        """A copy of ``value`` with every media block's bytes moved to a blob (``value`` is not changed)."""
        if isinstance(value, dict):
            if _is_media(value):
                return self._store(value)
            return {k: self.externalize(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.externalize(v) for v in value]
        if hasattr(value, "to_dict") and not isinstance(value, type):
            return self.externalize(value.to_dict())
        return value


def inline(value: Any, run_dir: Path) -> Any:
    """The reverse of ``externalize``: blob references replaced by their base64 data again."""
    if isinstance(value, dict):
        blob = value.get("blob")
        if isinstance(blob, str) and value.get("type") in _MEDIA_TYPES and "data" not in value:
            data = base64.b64encode((Path(run_dir) / blob).read_bytes()).decode()
            keep = {k: v for k, v in value.items() if k not in {"blob", "bytes", "width", "height"}}
            return {**keep, "data": data}
        return {k: inline(v, run_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [inline(v, run_dir) for v in value]
    return value


def describe_blob(block: dict[str, Any]) -> str:
    """``[image 64x64 png, blobs/ab12cd34...]``: how inspect shows a media block."""
    kind = str(block.get("type", "media"))
    media = str(block.get("media_type", ""))
    size = f" {block['width']}x{block['height']}" if "width" in block and "height" in block else ""
    fmt = f" {extension(media)}" if media else ""
    blob = str(block.get("blob", ""))
    where = f", {blob[: len(BLOBS_DIR) + 1 + 12]}..." if blob else ""
    return f"[{kind}{size}{fmt}{where}]"
