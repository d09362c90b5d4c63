"""OpenAI Responses (``POST /v1/responses``), used statelessly: ``store: false`` and the whole history sent
every turn, like the other two protocols. Message content is a plain string when text only, by default
(``provider.content_format``), and the optional fields follow ``provider.wire`` (``store``, ``reasoning``,
``parallel_tool_calls``, ``metadata``), so proxies that translate to other backends (LiteLLM) get past turn 2.

Reasoning items come back with ``encrypted_content`` (we ask for it through ``include``) and are kept in the
history as canonical ``reasoning`` blocks, then sent back verbatim before the function calls they preceded:
with ``store: false`` that blob is the only way the model gets its reasoning back in a multi-turn tool loop.
"""

from __future__ import annotations

import copy
from typing import Any

from flowllm.core.interfaces import WireProtocol
from flowllm.core.types import Block, Message, ModelResponse, NativeToolCall, ToolSpec, Usage
from flowllm.providers.base import (
    BaseProvider,
    image_data_url,
    strip_cache_control,
    system_text,
    text_or_parts,
    tool_result_images,
    tool_result_text,
    wire_tool_name,
)
from flowllm.providers.errors import ProviderCallError, classify_error_type
from flowllm.providers.wire.models import effort_for_budget
from flowllm.providers.wire.openai_chat import tool_call_arguments, tool_use_block
from flowllm.providers.wire.streaming import assemble_responses

INCOMPLETE_REASONS = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}


def _user_parts(blocks: list[Block]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if b.get("type") == "text" and b.get("text"):
            parts.append({"type": "input_text", "text": b["text"]})
        elif b.get("type") == "image":
            parts.append({"type": "input_image", "image_url": image_data_url(b), "detail": "auto"})
    return parts


class OpenAIResponsesProvider(BaseProvider):
    protocol: WireProtocol = "openai_responses"

    def _resource(self, client: Any) -> Any:
        return client.responses

    @property
    def _store(self) -> bool:
        return bool((self.cfg.extra_body or {}).get("store", self.cfg.wire.store))

    # ----- canonical -> wire -----------------------------------------------------------------------------
    def _input(self, messages: list[Message]) -> list[dict[str, Any]]:
        fmt = self.content_format
        items: list[dict[str, Any]] = []
        for message in self.sendable(messages):
            blocks = message["content"]
            if message["role"] == "user":
                rest: list[Block] = []
                for b in blocks:
                    if b.get("type") == "tool_result":
                        items.append(
                            {
                                "type": "function_call_output",
                                "call_id": b["tool_use_id"],
                                "output": tool_result_text(b),
                            }
                        )
                        rest.extend(tool_result_images(b))
                    else:
                        rest.append(b)
                parts = _user_parts(rest)
                if parts:
                    content = text_or_parts(parts, fmt, text_type="input_text")
                    items.append({"type": "message", "role": "user", "content": content})
                continue
            # Assistant: items in the order the model produced them (reasoning before the calls it led to).
            for b in blocks:
                btype = b.get("type")
                if btype == "reasoning":
                    if not b.get("encrypted_content") and not self._store:
                        continue  # without the blob (or server-side storage) the API cannot resolve the item
                    item: dict[str, Any] = {
                        "type": "reasoning",
                        "summary": copy.deepcopy(b.get("summary") or []),
                    }
                    if b.get("id"):
                        item["id"] = b["id"]
                    if b.get("encrypted_content"):
                        item["encrypted_content"] = b["encrypted_content"]
                    items.append(item)
                elif btype == "text" and b.get("text"):
                    text_parts = [{"type": "output_text", "text": b["text"]}]
                    content = text_or_parts(text_parts, fmt, text_type="output_text")
                    items.append({"type": "message", "role": "assistant", "content": content})
                elif btype == "tool_use":
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": b["id"],
                            "name": b["name"],
                            "arguments": tool_call_arguments(b),
                        }
                    )
        return items

    def unshaped_request(
        self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        cfg = self.cfg
        request: dict[str, Any] = {"model": self.model}
        instructions = system_text(system)
        if instructions:
            request["instructions"] = instructions
        request["input"] = self._input(messages)
        request["max_output_tokens"] = cfg.max_tokens
        wire = cfg.wire
        if wire.store is not None:
            request["store"] = wire.store
        if tools and self.tool_protocol == "native":
            request["tools"] = [
                {
                    "type": "function",
                    "name": wire_tool_name(t),
                    "description": t.get("description", ""),
                    "parameters": strip_cache_control(t.get("input_schema") or {"type": "object", "properties": {}}),
                    "strict": False,
                }
                for t in tools
            ]
            if wire.parallel_tool_calls is not None:
                request["parallel_tool_calls"] = wire.parallel_tool_calls
        if cfg.thinking.mode in ("enabled", "adaptive") and wire.reasoning_effort:
            effort = "medium" if cfg.thinking.mode == "adaptive" else effort_for_budget(cfg.thinking.budget_tokens)
            request["reasoning"] = {"effort": effort, "summary": "auto"}
            request["include"] = ["reasoning.encrypted_content"]
        elif cfg.temperature is not None and cfg.thinking.mode == "disabled":
            request["temperature"] = cfg.temperature
        if cfg.stream:
            request["stream"] = True
        if wire.metadata:
            request["metadata"] = dict(wire.metadata)
        if cfg.extra_body:
            request.update(copy.deepcopy(dict(cfg.extra_body)))
        return request

    # ----- wire -> canonical -----------------------------------------------------------------------------
    def check_stream_events(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if event.get("type") == "error":
                kind = classify_error_type(event.get("code") or event.get("type"))
                raise ProviderCallError(
                    str(event.get("message") or "error event in the stream"),
                    kind=kind,
                    provider=self.name,
                    status=200,
                    error_type=event.get("code"),
                )
            if event.get("type") == "response.failed":
                self._raise_failed(event.get("response") or {})

    def _raise_failed(self, body: dict[str, Any]) -> None:
        error = body.get("error") or {}
        code = error.get("code") or "server_error"
        raise ProviderCallError(
            str(error.get("message") or "the response failed"),
            kind=classify_error_type(code),
            provider=self.name,
            error_type=code,
        )

    def stream_complete(self, events: list[dict[str, Any]]) -> bool:
        return any(e.get("type") in ("response.completed", "response.incomplete") for e in events)

    def assemble_stream(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        return assemble_responses(events)

    def read_body(self, body: dict[str, Any]) -> tuple[ModelResponse, Usage | None]:
        if body.get("status") == "failed":
            self._raise_failed(body)
        blocks: list[Block] = []
        calls: list[NativeToolCall] = []
        texts: list[str] = []
        thinking: list[str] = []
        for item in body.get("output") or []:
            itype = item.get("type")
            if itype == "reasoning":
                summary = item.get("summary") or []
                thinking.extend(s.get("text", "") for s in summary if isinstance(s, dict))
                blocks.append(
                    {
                        "type": "reasoning",
                        "id": item.get("id", ""),
                        "summary": copy.deepcopy(summary),
                        "encrypted_content": item.get("encrypted_content"),
                    }
                )
            elif itype == "message":
                for part in item.get("content") or []:
                    text = part.get("text") if part.get("type") == "output_text" else part.get("refusal")
                    if text:
                        texts.append(text)
                        blocks.append({"type": "text", "text": text})
            elif itype == "function_call":
                arguments = item.get("arguments") or ""
                calls.append(NativeToolCall(id=item.get("call_id", ""), name=item.get("name", ""), arguments=arguments))
                blocks.append(tool_use_block(item.get("call_id", ""), item.get("name", ""), arguments))
        status = body.get("status")
        if status == "incomplete":
            reason = str((body.get("incomplete_details") or {}).get("reason") or "incomplete")
            stop = INCOMPLETE_REASONS.get(reason, reason)
        else:
            stop = "tool_use" if calls else "end_turn"
        response = ModelResponse(
            text="".join(texts),
            stop_reason=stop,
            content_blocks=blocks,
            tool_calls=calls,
            thinking="\n\n".join(t for t in thinking if t),
            model=body.get("model", ""),
            id=body.get("id", ""),
        )
        return response, responses_usage(body.get("usage"))


def responses_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    return Usage(
        input_tokens=int(raw.get("input_tokens") or 0),  # includes the cached part
        output_tokens=int(raw.get("output_tokens") or 0),
        cache_read_tokens=int((raw.get("input_tokens_details") or {}).get("cached_tokens") or 0),
        cache_write_tokens=0,
        reasoning_tokens=int((raw.get("output_tokens_details") or {}).get("reasoning_tokens") or 0),
    )
