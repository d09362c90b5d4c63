"""The Anthropic Messages protocol (api.anthropic.com and compatible endpoints such as MiniMax).

Canonical blocks follow Anthropic's own shapes, so the translation is mostly verbatim; what matters is what
must *not* change: thinking and redacted_thinking blocks go back exactly as received (signature included, also
when the thinking text is empty), and cache breakpoints placed by ``mark_cache`` are carried on the blocks they
mark. Text-only content (the ``system`` field, a message, a tool result) goes as a plain string unless it
carries a cache breakpoint (``provider.content_format``): compatible endpoints and proxies (LiteLLM) refuse a
``system`` list.
"""

from __future__ import annotations

import copy
from typing import Any

from flowllm.config.provider_schema import ContentFormat
from flowllm.core.interfaces import WireProtocol
from flowllm.core.types import Block, Message, ModelResponse, NativeToolCall, ToolSpec, Usage
from flowllm.providers.base import CACHE_KEY, BaseProvider, dump_arguments, estimate_tokens, wire_tool_name
from flowllm.providers.clients import ClientShards
from flowllm.providers.wire.streaming import assemble_anthropic


def _cache(block: dict[str, Any], source: Block | ToolSpec, enabled: bool) -> dict[str, Any]:
    cc: Any = source.get(CACHE_KEY) if isinstance(source, dict) else None
    if enabled and isinstance(cc, dict) and cc:
        block[CACHE_KEY] = dict(cc)
    return block


def _as_content(parts: list[dict[str, Any]], fmt: ContentFormat) -> str | list[dict[str, Any]]:
    """Content blocks, or their joined text when they are all text and the format allows a string (``auto``:
    only when no block carries a cache breakpoint, which needs the block form)."""
    if not parts or fmt is ContentFormat.parts:
        return parts
    marked = False
    for p in parts:  # one pass: every block text, and whether one carries a breakpoint
        if p.get("type") != "text":
            return parts
        marked = marked or CACHE_KEY in p
    if fmt is ContentFormat.string or not marked:
        return parts[0]["text"] if len(parts) == 1 else "\n\n".join(p["text"] for p in parts)
    return parts


class AnthropicProvider(BaseProvider):
    protocol: WireProtocol = "anthropic"

    def __init__(self, cfg: Any, clients: ClientShards) -> None:
        super().__init__(cfg, clients)
        self.supports_cache_control = bool(cfg.cache.enabled)

    def _resource(self, client: Any) -> Any:
        return client.messages

    # ----- canonical -> wire -----------------------------------------------------------------------------
    def _block(self, block: Block) -> dict[str, Any] | None:
        cache = self.supports_cache_control
        btype = block.get("type")
        if btype == "text":
            if not block.get("text"):
                return None  # the API refuses empty text blocks; they carry nothing
            return _cache({"type": "text", "text": block["text"]}, block, cache)
        if btype == "image":
            source = {
                "type": "base64",
                "media_type": block.get("media_type", "image/png"),
                "data": block.get("data", ""),
            }
            return _cache({"type": "image", "source": source}, block, cache)
        if btype == "tool_use":
            return _cache(
                {
                    "type": "tool_use",
                    "id": block["id"],
                    "name": block["name"],
                    "input": block.get("input") or {},
                },
                block,
                cache,
            )
        if btype == "tool_result":
            content = block.get("content", [])
            if isinstance(content, str):
                parts: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
            else:
                parts = [p for p in (self._block(b) for b in content) if p is not None]
            out: dict[str, Any] = {"type": "tool_result", "tool_use_id": block["tool_use_id"]}
            if parts:
                out["content"] = _as_content(parts, self.content_format)
            if block.get("is_error"):
                out["is_error"] = True
            return _cache(out, block, cache)
        if btype == "thinking":
            # Verbatim, never cached (the API forbids cache_control here), kept even when the text is empty.
            return {
                "type": "thinking",
                "thinking": block.get("thinking", ""),
                "signature": block.get("signature", ""),
            }
        if btype == "redacted_thinking":
            return {"type": "redacted_thinking", "data": block.get("data", "")}
        if btype == "reasoning":
            return None  # an OpenAI Responses item: meaningless to Anthropic
        extra = {k: v for k, v in block.items() if k != CACHE_KEY}  # unknown block types pass through
        return _cache(copy.deepcopy(extra), block, cache)

    def _message(self, message: Message) -> dict[str, Any]:
        content = [b for b in (self._block(x) for x in message["content"]) if b is not None]
        return {"role": message["role"], "content": _as_content(content, self.content_format)}

    def unshaped_request(
        self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        cfg = self.cfg
        request: dict[str, Any] = {"model": self.model, "max_tokens": cfg.max_tokens}
        sys_blocks = [b for b in (self._block(s) for s in system) if b is not None]
        if sys_blocks:
            request["system"] = _as_content(sys_blocks, self.content_format)
        request["messages"] = [self._message(m) for m in self.sendable(messages)]
        if tools and self.tool_protocol == "native":
            request["tools"] = [
                _cache(
                    {
                        "name": wire_tool_name(t),
                        "description": t.get("description", ""),
                        "input_schema": t.get("input_schema") or {"type": "object", "properties": {}},
                    },
                    t,
                    self.supports_cache_control,
                )
                for t in tools
            ]
        mode = cfg.thinking.mode
        if mode == "enabled":
            budget = int(cfg.thinking.budget_tokens)
            request["thinking"] = {"type": "enabled", "budget_tokens": budget}
            # The API requires max_tokens > budget_tokens.
            request["max_tokens"] = max(cfg.max_tokens, budget + 1)
        elif mode == "adaptive":
            request["thinking"] = {"type": "adaptive"}
        elif cfg.temperature is not None:
            # With thinking on, the API accepts no temperature but 1: leave it out rather than fail.
            request["temperature"] = cfg.temperature
        if cfg.stream:
            request["stream"] = True
        if cfg.wire.metadata:
            request["metadata"] = dict(cfg.wire.metadata)
        if cfg.extra_body:
            request.update(copy.deepcopy(dict(cfg.extra_body)))
        return request

    # ----- wire -> canonical -----------------------------------------------------------------------------
    def stream_complete(self, events: list[dict[str, Any]]) -> bool:
        return any(e.get("type") == "message_stop" for e in events)

    def assemble_stream(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        return assemble_anthropic(events)

    def read_body(self, body: dict[str, Any]) -> tuple[ModelResponse, Usage | None]:
        blocks: list[Block] = []
        calls: list[NativeToolCall] = []
        texts: list[str] = []
        thinking: list[str] = []
        for item in body.get("content") or []:
            itype = item.get("type")
            if itype == "text":
                texts.append(item.get("text", ""))
                blocks.append({"type": "text", "text": item.get("text", "")})
            elif itype == "thinking":
                thinking.append(item.get("thinking", ""))
                blocks.append(
                    {
                        "type": "thinking",
                        "thinking": item.get("thinking", ""),
                        "signature": item.get("signature", ""),
                    }
                )
            elif itype == "redacted_thinking":
                blocks.append({"type": "redacted_thinking", "data": item.get("data", "")})
            elif itype == "tool_use":
                args = item.get("input") or {}
                calls.append(NativeToolCall(id=item["id"], name=item["name"], arguments=dump_arguments(args)))
                blocks.append({"type": "tool_use", "id": item["id"], "name": item["name"], "input": args})
            else:
                blocks.append(copy.deepcopy(item))  # server tool blocks etc.: kept verbatim for the next turn
        response = ModelResponse(
            text="".join(texts),
            stop_reason=body.get("stop_reason"),
            content_blocks=blocks,
            tool_calls=calls,
            thinking="\n\n".join(t for t in thinking if t),
            model=body.get("model", ""),
            id=body.get("id", ""),
        )
        raw = body.get("usage")
        if not isinstance(raw, dict):
            return response, None
        read = int(raw.get("cache_read_input_tokens") or 0)
        write = int(raw.get("cache_creation_input_tokens") or 0)
        # The writes by TTL (usage.cache_creation: ephemeral_5m_input_tokens, ephemeral_1h_input_tokens), when
        # the server says: the one-hour part is billed at its own price (flowllm/spend/pricing.py).
        split = raw.get("cache_creation")
        written_1h = int(split.get("ephemeral_1h_input_tokens") or 0) if isinstance(split, dict) else 0
        output = int(raw.get("output_tokens") or 0)
        usage = Usage(
            # Anthropic's input_tokens excludes cache reads and writes; ours counts every prompt token.
            input_tokens=int(raw.get("input_tokens") or 0) + read + write,
            output_tokens=output,
            cache_read_tokens=read,
            cache_write_tokens=write,
            cache_write_1h_tokens=min(written_1h, write),
            # Anthropic reports no thinking count: estimated from the visible thinking text, within output.
            reasoning_tokens=min(estimate_tokens(response.thinking), output),
        )
        return response, usage
