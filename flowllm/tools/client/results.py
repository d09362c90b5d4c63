"""An MCP ``CallToolResult`` as a flowllm ``ToolResult``: every content kind, in the server's order.

Text stays text; images become image blocks (``parts`` keeps text and images interleaved as sent); an
embedded text resource is shown with its URI, a binary one or audio is named (the model cannot read it);
``structuredContent`` is kept on the result and shown as JSON when the server sent no text.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from flowllm.core.types import Block


def truncate_text(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` characters with a note saying how much was cut (no cut when it fits)."""
    if limit <= 0 or len(text) <= limit:
        return text
    cut = len(text) - limit
    return f"{text[:limit]}\n[... {cut:,} of {len(text):,} characters cut: the result was longer than {limit:,}]"


def _item_text(item: Any) -> str | None:
    if isinstance(item, types.TextContent):
        return item.text
    if isinstance(item, types.EmbeddedResource):
        res = item.resource
        if isinstance(res, types.TextResourceContents):
            return f"[resource {res.uri}]\n{res.text}"
        return f"[binary resource {res.uri} ({res.mime_type or 'unknown type'}) not shown]"
    if isinstance(item, types.ResourceLink):
        described = f" ({item.description})" if getattr(item, "description", None) else ""
        return f"[resource link: {item.uri}{described}; read it with read_resource]"
    if isinstance(item, types.AudioContent):
        return f"[audio ({item.mime_type}) not shown]"
    return None


def convert_content(result: types.CallToolResult) -> tuple[str, list[Block], list[Block], Any]:
    """(text, image blocks, ordered parts, structured content) of one result.

    ``parts`` is empty when the result holds no image (the text alone says it all); otherwise it is the text
    and image blocks in the server's order.
    """
    texts: list[str] = []
    images: list[Block] = []
    parts: list[Block] = []
    for item in result.content:
        if isinstance(item, types.ImageContent):
            block: Block = {"type": "image", "media_type": item.mime_type, "data": item.data}
            images.append(block)
            parts.append(block)
            continue
        text = _item_text(item)
        if text is not None:
            texts.append(text)
            parts.append({"type": "text", "text": text})
    structured = result.structured_content
    if not texts and structured is not None:
        text = json.dumps(structured, ensure_ascii=False, sort_keys=True)
        texts.append(text)
        parts.insert(0, {"type": "text", "text": text})
    return "\n".join(texts), images, parts if images else [], structured


def convert_result(result: types.CallToolResult) -> tuple[str, list[Block]]:
    """An MCP result's content as (text, image blocks)."""
    text, images, _parts, _structured = convert_content(result)
    return text, images
