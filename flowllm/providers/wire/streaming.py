"""Folding saved stream events back into the body a non-streamed call would have returned.

``normalize`` reads only bodies; a streamed call's raw record is its list of events, and one of these folds
turns it into the equivalent body first. That single reader is why streamed and plain calls of the same reply
normalise to identical ``ModelResponse`` objects, and why replay from disk needs no SDK.

We merge tool-call fragments ourselves instead of trusting SDK accumulators: some compatible servers repeat
the id and name in every fragment (so id and name are overwritten, only ``arguments`` is concatenated),
parallel calls can arrive interleaved (so fragments are keyed by their ``index``), and some reuse an index for
the next call (so a new id at a known index starts a new call).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCallFragments:
    """Merges OpenAI Chat ``delta.tool_calls`` fragments by index (calls ordered by index, then by start).

    A fragment whose id differs from the id of the call open at its index starts a new call: some servers
    reuse index 0 for every call of a reply, and merging those would concatenate two calls' arguments.
    """

    calls: list[dict[str, Any]] = field(default_factory=list)
    _at_index: dict[int, int] = field(default_factory=dict)  # wire index -> position of its open call
    _order: list[tuple[int, int]] = field(default_factory=list)  # per position: (wire index, position)
    _last: int | None = None

    def _new(self, index: int | None = None) -> int:
        position = len(self.calls)
        self.calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        self._order.append((position if index is None else index, position))
        return position

    def _position(self, fragment: dict[str, Any]) -> int:
        index = fragment.get("index")
        frag_id = fragment.get("id")
        if index is None:
            # Without an index: the call with the same id, else the call being built, else a new one.
            match = [i for i, c in enumerate(self.calls) if frag_id and c.get("id") == frag_id]
            if match:
                return match[0]
            return self._last if self._last is not None and not frag_id else self._new()
        position = self._at_index.get(index)
        if position is None or (frag_id and self.calls[position]["id"] and self.calls[position]["id"] != frag_id):
            position = self._new(index)
            self._at_index[index] = position
        return position

    def add(self, fragment: dict[str, Any]) -> None:
        position = self._position(fragment)
        call = self.calls[position]
        self._last = position
        if fragment.get("id"):
            call["id"] = fragment["id"]
        if fragment.get("type"):
            call["type"] = fragment["type"]
        function = fragment.get("function") or {}
        if function.get("name"):
            call["function"]["name"] = function["name"]
        if function.get("arguments"):
            call["function"]["arguments"] += function["arguments"]

    def result(self) -> list[dict[str, Any]]:
        return [self.calls[position] for _, position in sorted(self._order)]


def assemble_anthropic(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Anthropic ``message_start`` / ``content_block_*`` / ``message_delta`` events -> a Message body."""
    message: dict[str, Any] = {"type": "message", "role": "assistant", "content": [], "stop_reason": None}
    usage: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, list[str]] = {}
    for event in events:
        etype = event.get("type")
        if etype == "message_start":
            message.update({k: v for k, v in event["message"].items() if k not in ("content", "usage")})
            usage.update(event["message"].get("usage") or {})
        elif etype == "content_block_start":
            index = event["index"]
            blocks[index] = copy.deepcopy(event["content_block"])
        elif etype == "content_block_delta":
            index, delta = event["index"], event["delta"]
            block = blocks[index]
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif dtype == "signature_delta":
                block["signature"] = block.get("signature", "") + delta["signature"]
            elif dtype == "input_json_delta":
                partial_json.setdefault(index, []).append(delta.get("partial_json", ""))
            elif dtype == "citations_delta":
                block.setdefault("citations", []).append(delta["citation"])
        elif etype == "message_delta":
            message.update(event.get("delta") or {})
            # message_delta usage is cumulative: the latest value of each field wins, it is never added up.
            usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
    for index, parts in partial_json.items():
        text = "".join(parts)
        blocks[index]["input"] = json.loads(text) if text.strip() else {}
    message["content"] = [blocks[i] for i in sorted(blocks)]
    if usage:
        message["usage"] = usage
    return message


def assemble_chat(events: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI ``chat.completion.chunk`` events -> a ``chat.completion`` body (usage from the final chunk)."""
    body: dict[str, Any] = {"object": "chat.completion", "choices": []}
    choices: dict[int, dict[str, Any]] = {}
    merges: dict[int, ToolCallFragments] = {}
    for chunk in events:
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if chunk.get(key) is not None:
                body[key] = chunk[key]
        if chunk.get("usage"):
            body["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = choice.get("index", 0)
            state = choices.setdefault(
                index,
                {"index": index, "message": {"role": "assistant", "content": None}, "finish_reason": None},
            )
            delta = choice.get("delta") or {}
            msg = state["message"]
            if delta.get("role"):
                msg["role"] = delta["role"]
            for key in ("content", "reasoning_content", "refusal"):
                if delta.get(key):
                    msg[key] = (msg.get(key) or "") + delta[key]
            for fragment in delta.get("tool_calls") or []:
                merges.setdefault(index, ToolCallFragments()).add(fragment)
            if choice.get("finish_reason"):
                state["finish_reason"] = choice["finish_reason"]
    for index, merge in merges.items():
        choices[index]["message"]["tool_calls"] = merge.result()
    body["choices"] = [choices[i] for i in sorted(choices)]
    return body


def assemble_responses(events: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI Responses stream events -> a Response body.

    Output items are rebuilt from ``output_item.added`` and the deltas, and replaced by ``output_item.done``
    when it comes; ids, status and usage come from the last ``response.*`` snapshot (``response.completed``).
    """
    body: dict[str, Any] = {"object": "response", "output": []}
    items: dict[int, dict[str, Any]] = {}
    snapshot_output: list[Any] = []
    for event in events:
        etype = event.get("type", "")
        if etype in (
            "response.created",
            "response.in_progress",
            "response.completed",
            "response.incomplete",
            "response.failed",
            "response.queued",
        ):
            snapshot = event.get("response") or {}
            body.update({k: v for k, v in snapshot.items() if k != "output"})
            snapshot_output = snapshot.get("output") or snapshot_output
        elif etype == "response.output_item.added" or etype == "response.output_item.done":
            items[event["output_index"]] = copy.deepcopy(event["item"])
        elif etype == "response.content_part.added":
            content = items[event["output_index"]].setdefault("content", [])
            _put(content, event["content_index"], copy.deepcopy(event["part"]))
        elif etype == "response.output_text.delta":
            part = items[event["output_index"]]["content"][event["content_index"]]
            part["text"] = part.get("text", "") + event["delta"]
        elif etype == "response.reasoning_summary_part.added":
            summary = items[event["output_index"]].setdefault("summary", [])
            _put(summary, event["summary_index"], copy.deepcopy(event["part"]))
        elif etype == "response.reasoning_summary_text.delta":
            part = items[event["output_index"]]["summary"][event["summary_index"]]
            part["text"] = part.get("text", "") + event["delta"]
        elif etype == "response.function_call_arguments.delta":
            item = items[event["output_index"]]
            item["arguments"] = item.get("arguments", "") + event["delta"]
        elif etype == "response.function_call_arguments.done":
            items[event["output_index"]]["arguments"] = event["arguments"]
    # A server that sends only snapshots (no item events) still yields its output.
    body["output"] = [items[i] for i in sorted(items)] if items else snapshot_output
    return body


def _put(values: list[Any], index: int, value: Any) -> None:
    while len(values) <= index:
        values.append(None)
    values[index] = value
