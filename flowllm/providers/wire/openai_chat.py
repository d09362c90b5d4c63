"""OpenAI Chat Completions (api.openai.com and the compatible world: DeepSeek, OpenRouter, DashScope/Qwen,
vLLM, SGLang, Ollama).

Canonical -> wire (content as a plain string when text only, by default: ``provider.content_format``; the
optional fields OpenAI accepts and other servers refuse follow ``provider.wire``): the system prompt becomes a
``system`` message; a user message that answers tool calls
becomes one ``role: tool`` message per ``tool_result`` (images from tool results follow in a user message,
since tool messages carry text only), then a user message with the rest. Assistant ``tool_use`` blocks become
``tool_calls``. Cache breakpoints are dropped (OpenAI caches automatically). Thinking blocks become
``reasoning_content`` on assistant messages that carry tool calls (DeepSeek needs it back inside a tool loop,
and ignores it elsewhere).

For servers that render the model's own chat template, ``provider.history`` (or the model family's needs,
``models.py``) keeps user and assistant turns alternating and gives tool calls 9-character ids
(``chat_history.py``); ``models.py`` also drops or renames the fields a model refuses (``build_request``).
"""

from __future__ import annotations

import copy
from typing import Any

from flowllm.config.provider_schema import ContentFormat
from flowllm.core.interfaces import WireProtocol
from flowllm.core.types import Block, Message, ModelResponse, NativeToolCall, ToolSpec, Usage
from flowllm.providers.base import (
    BaseProvider,
    dump_arguments,
    image_data_url,
    parse_arguments,
    strip_cache_control,
    system_text,
    text_or_parts,
    tool_result_images,
    tool_result_text,
    wire_tool_name,
)
from flowllm.providers.wire.chat_history import alternate, portable_id
from flowllm.providers.wire.models import effort_for_budget, traits_for
from flowllm.providers.wire.streaming import assemble_chat

# Chat finish reasons in the canonical (Anthropic) vocabulary every consumer of ModelResponse reads.
FINISH_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def _user_parts(blocks: list[Block]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if b.get("type") == "text" and b.get("text"):
            parts.append({"type": "text", "text": b["text"]})
        elif b.get("type") == "image":
            parts.append({"type": "image_url", "image_url": {"url": image_data_url(b)}})
    return parts


def _text(text: str, fmt: ContentFormat) -> str | list[dict[str, Any]]:
    """Text content: a string, or (``parts``) one text part; never null (servers' validators refuse it)."""
    return [{"type": "text", "text": text}] if fmt is ContentFormat.parts and text else text


def tool_call_arguments(block: Block) -> str:
    """The arguments text of a canonical tool_use: the server's own text when kept, else the dict as JSON."""
    raw = block.get("arguments_text")
    return raw if isinstance(raw, str) else dump_arguments(block.get("input") or {})


def tool_use_block(call_id: str, name: str, arguments: str) -> Block:
    """A canonical tool_use block; ``arguments_text`` keeps the server's exact text whenever ``input`` would
    not dump back to it (other spacing, or text that does not parse), so the next turn sends what the model
    wrote."""
    args, clean = parse_arguments(arguments)
    block: dict[str, Any] = {"type": "tool_use", "id": call_id, "name": name, "input": args}
    if not clean or dump_arguments(args) != arguments:
        block["arguments_text"] = arguments
    return block  # type: ignore[return-value]


class OpenAIChatProvider(BaseProvider):
    protocol: WireProtocol = "openai_chat"

    def __init__(self, cfg: Any, client: Any, *more_clients: Any) -> None:
        super().__init__(cfg, client, *more_clients)
        traits = traits_for(self.model)
        history = cfg.history
        # provider.history, else what the model family's chat template needs (flowllm/providers/wire/models.py).
        self.alternate_roles: bool = (
            traits.alternate_roles if history.alternate_roles is None else history.alternate_roles
        )
        self.portable_ids: bool = traits.portable_ids if history.portable_ids is None else history.portable_ids

    def _resource(self, client: Any) -> Any:
        return client.chat.completions

    # ----- canonical -> wire -----------------------------------------------------------------------------
    def _messages(self, system: list[Block], messages: list[Message]) -> list[dict[str, Any]]:
        fmt = self.content_format
        out: list[dict[str, Any]] = []
        sys_text = system_text(system)
        if sys_text:
            out.append({"role": "system", "content": _text(sys_text, fmt)})
        for message in self.sendable(messages):
            blocks = message["content"]
            if message["role"] == "user":
                rest: list[Block] = []
                for b in blocks:
                    if b.get("type") == "tool_result":
                        content = _text(tool_result_text(b), fmt)
                        out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": content})
                        rest.extend(tool_result_images(b))
                    else:
                        rest.append(b)
                parts = _user_parts(rest)
                if parts:
                    out.append({"role": "user", "content": text_or_parts(parts, fmt)})
                continue
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            calls = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": tool_call_arguments(b)},
                }
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            # "" rather than null beside tool calls: strict servers (llama-cpp-python) refuse a null content.
            msg: dict[str, Any] = {"role": "assistant", "content": _text(text, fmt)}
            if calls:
                msg["tool_calls"] = calls
                reasoning = "".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking")
                if reasoning:
                    msg["reasoning_content"] = reasoning
            if text or calls:
                out.append(msg)
        return alternate(out) if self.alternate_roles else out

    def unshaped_request(
        self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        cfg = self.cfg
        wire = cfg.wire
        request: dict[str, Any] = {
            "model": self.model,
            "messages": self._messages(system, messages),
            str(wire.max_tokens_field): cfg.max_tokens,
        }
        if tools and self.tool_protocol == "native":
            request["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": wire_tool_name(t),
                        "description": t.get("description", ""),
                        "parameters": strip_cache_control(
                            t.get("input_schema") or {"type": "object", "properties": {}}
                        ),
                    },
                }
                for t in tools
            ]
            if wire.parallel_tool_calls is not None:
                request["parallel_tool_calls"] = wire.parallel_tool_calls
        if cfg.thinking.mode in ("enabled", "adaptive") and wire.reasoning_effort:
            # The standard Chat knob for reasoning models; vendors with their own flags (DashScope's
            # enable_thinking, ...) set them through provider.extra_body.
            request["reasoning_effort"] = effort_for_budget(cfg.thinking.budget_tokens)
        if cfg.temperature is not None:
            request["temperature"] = cfg.temperature
        if cfg.stream:
            request["stream"] = True
            if wire.stream_usage:
                request["stream_options"] = {"include_usage": True}  # usage arrives in the final chunk
        if wire.metadata:
            if wire.store:  # Chat takes metadata only with store: true (models.py drops it otherwise)
                request["store"] = True
            request["metadata"] = dict(wire.metadata)
        if cfg.extra_body:
            request.update(copy.deepcopy(dict(cfg.extra_body)))
        return request

    # ----- wire -> canonical -----------------------------------------------------------------------------
    def stream_complete(self, events: list[dict[str, Any]]) -> bool:
        # Every choice ends with a finish_reason; the usage-only chunk that may follow carries no choices.
        return any(c.get("finish_reason") for e in events for c in e.get("choices") or [])

    def assemble_stream(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        return assemble_chat(events)

    def read_body(self, body: dict[str, Any]) -> tuple[ModelResponse, Usage | None]:
        choices = body.get("choices") or []
        if not choices:
            raise ValueError("the response has no choices")
        choice = choices[0]
        msg = choice.get("message") or {}
        blocks: list[Block] = []
        # DeepSeek and vLLM say reasoning_content, OpenRouter says reasoning.
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
        if reasoning:
            blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        text = msg.get("content") or ""
        if text:
            blocks.append({"type": "text", "text": text})
        calls: list[NativeToolCall] = []
        for index, call in enumerate(msg.get("tool_calls") or []):
            fn = call.get("function") or {}
            arguments = fn.get("arguments") or ""
            server_id = str(call.get("id") or "")
            call_id = server_id
            if self.portable_ids or not server_id:
                # 9 letters and digits, derived from the server's id (kept on the block): every template takes it.
                call_id = portable_id(server_id, response_id=str(body.get("id") or ""), index=index)
            calls.append(NativeToolCall(id=call_id, name=fn.get("name", ""), arguments=arguments))
            block = tool_use_block(call_id, fn.get("name", ""), arguments)
            if call_id != server_id:
                block["server_id"] = server_id
            blocks.append(block)
        finish = choice.get("finish_reason")
        response = ModelResponse(
            text=text,
            stop_reason=FINISH_REASONS.get(finish, finish),
            content_blocks=blocks,
            tool_calls=calls,
            thinking=reasoning,
            model=body.get("model", ""),
            id=body.get("id", ""),
        )
        return response, chat_usage(body.get("usage"))


def chat_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    cached = prompt_details.get("cached_tokens")
    if cached is None:
        cached = raw.get("prompt_cache_hit_tokens")  # DeepSeek's own field
    return Usage(
        # prompt_tokens already includes the cached part: nothing to add.
        input_tokens=int(raw.get("prompt_tokens") or 0),
        output_tokens=int(raw.get("completion_tokens") or 0),
        cache_read_tokens=int(cached or 0),
        cache_write_tokens=0,
        reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
    )
