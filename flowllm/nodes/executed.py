"""The assistant message a turn leaves in the history: what was executed, not what the server first wrote.

A native tool call's arguments may arrive broken (cut by ``max_tokens``, a stray quote). ``repair_arguments``
repairs them and the tool runs with the repaired dict; the history must then carry that dict too. Sending the
server's raw text back makes every chat template that renders object arguments parse it again, and servers
refuse the whole request (llama.cpp: HTTP 500 "Failed to parse tool call arguments as JSON"), turn after turn.

* A call whose arguments were repaired: ``input`` is the executed dict, the raw text is dropped.
* A call whose arguments could not be repaired: ``input`` is a well-formed record of the bad call,
  ``{"invalid_arguments": <the text as written>}``, so the model sees what it sent next to the error result.
* A native call the parser could not read at all (no name, an unknown tool): its ``tool_use`` block leaves
  the message (no tool result could answer it by id); the error goes back as text beside the results.
"""

from __future__ import annotations

from typing import Any

from flowllm.core.types import Block, Message, ModelResponse
from flowllm.nodes.toolcalls import PreparedCall
from flowllm.providers.base import parse_arguments

# The key of the record an unrepairable call's arguments become in the history.
INVALID_ARGUMENTS_KEY = "invalid_arguments"
# Canonical tool_use keys that hold the server's own text; the executed record replaces them.
_RAW_KEYS = ("arguments_text",)


def executed_input(prepared: PreparedCall) -> dict[str, Any]:
    """The arguments a call is recorded with: the executed dict, or the record of text that did not parse."""
    if prepared.arguments is not None:
        return dict(prepared.arguments)
    return {INVALID_ARGUMENTS_KEY: prepared.call.arguments_text}


def executed_message(response: ModelResponse, prepared_calls: list[PreparedCall]) -> tuple[Message, list[str]]:
    """The assistant message for the history and the ids of the native calls it answers.

    Only native calls (``tool_use`` blocks) are rewritten; a text-protocol reply is text and stays as written.
    """
    message = response.to_message()
    if not response.tool_calls:
        return message, []
    by_id = {p.call.id: p for p in prepared_calls}
    blocks: list[Block] = []
    kept: list[str] = []
    for block in message["content"]:
        if block.get("type") != "tool_use":
            blocks.append(block)
            continue
        prepared = by_id.get(str(block.get("id", "")))
        if prepared is None:
            continue  # unreadable: reported as text beside the results, never answered by a dangling id
        executed = executed_input(prepared)
        raw = block.get("arguments_text")
        if isinstance(raw, str) and parse_arguments(raw) == (executed, True):
            record: dict[str, Any] = dict(block)  # the model's own clean text (its spacing) still says this
        else:
            record = {k: v for k, v in block.items() if k not in _RAW_KEYS}
        record["input"] = executed
        blocks.append(record)  # type: ignore[arg-type]
        kept.append(prepared.call.id)
    return {**message, "content": blocks}, kept
