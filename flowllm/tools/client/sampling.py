"""The client's answer to a server's ``sampling/createMessage`` (``tools.sampling``).

``decline`` (the default): every request gets an MCP error whose message the server can pass on.

``answer``: a task's pool opens a ``Sampler``; the task's agent binds a handler to it when the conversation
starts (flowllm/agent/loop.py) and unbinds it when the conversation ends. A request from one of the task's own
servers then becomes one conversation with the run's provider, with no tools, recorded and counted like a
sub-agent (agent ``sampling``). Servers with ``scope: run`` are shared by every task, so none of their requests
can be attributed to a task: they keep declining, and say why.

What a request may hold: text and images (turned into flowllm's canonical blocks), the server's system prompt.
Audio, tool use and tool results are refused with an MCP error. ``maxTokens`` is recorded with the request but
the provider's own ``max_tokens`` applies (a provider takes no per-call limit); ``temperature``,
``stopSequences``, ``modelPreferences``, ``includeContext`` and ``metadata`` are not passed on: the provider's
config decides. A failed model call goes back to the server as an MCP error; the task's pool goes on.

This module knows MCP's types and flowllm's canonical ones, never the agent: the handler's contract
(``SamplingRequest`` -> ``SamplingReply``) lives in flowllm/core/interfaces.py.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging

import mcp_types as types

from flowllm.core.images import image_media_type
from flowllm.core.interfaces import SamplingHandler, SamplingReply, SamplingRequest
from flowllm.core.types import Block, Message, text_block

log = logging.getLogger("flowllm.tools.client.pool")

SAMPLING_DECLINED = (
    "flowllm does not answer sampling requests from tool servers (tools.sampling=decline): do the work without a model"
)
SAMPLING_SHARED = (
    "flowllm does not answer sampling requests from a run-scoped server: a server shared by all tasks cannot be "
    "attributed to a task, so its model calls could not be recorded or counted (give it scope: task)"
)
SAMPLING_NOT_READY = "no model is attached to this task's tools at the moment: do the work without a model"
ONE_LINE_CHARS = 300

# flowllm's canonical stop reasons -> MCP's; any other passes through (MCP's stopReason is an open set).
STOP_REASONS = {
    "end_turn": "endTurn",
    "max_tokens": "maxTokens",
    "stop_sequence": "stopSequence",
    "tool_use": "toolUse",
}


class SamplingRefused(Exception):
    """A request flowllm cannot send to its model; the message is for the server."""


def _error(code: int, message: str) -> types.ErrorData:
    return types.ErrorData(code=code, message=message)


def _image(item: types.ImageContent) -> Block:
    try:
        data = base64.b64decode(item.data, validate=True)
    except (binascii.Error, ValueError):
        raise SamplingRefused("an image of the request is not valid base64") from None
    media_type = image_media_type(data)
    if media_type is None:
        raise SamplingRefused(f"an image of the request ({item.mime_type}) is not png, jpeg, gif or webp")
    return {"type": "image", "media_type": media_type, "data": item.data}


def request_messages(params: types.CreateMessageRequestParams) -> list[Message]:
    """The request's conversation as canonical messages (consecutive messages of one role joined)."""
    messages: list[Message] = []
    for message in params.messages:
        blocks: list[Block] = []
        for item in message.content_as_list:
            if isinstance(item, types.TextContent):
                blocks.append(text_block(item.text))
            elif isinstance(item, types.ImageContent):
                blocks.append(_image(item))
            else:
                raise SamplingRefused(f"flowllm sends text and images to its model, not {item.type} content")
        if not blocks:
            continue
        if messages and messages[-1]["role"] == message.role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": message.role, "content": blocks})
    if not messages:
        raise SamplingRefused("the request has no message to answer")
    return messages


def message_result(reply: SamplingReply) -> types.CreateMessageResult:
    stop = STOP_REASONS.get(reply.stop_reason or "", reply.stop_reason)
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=reply.text),
        model=reply.model,
        stop_reason=stop,
    )


def _one_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # a node's failure wraps the provider's error: name that one
    if isinstance(cause, BaseException):
        exc = cause
    body = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {body}" if body else type(exc).__name__
    return line if len(line) <= ONE_LINE_CHARS else line[: ONE_LINE_CHARS - 3] + "..."


class Sampler:
    """A task's answer to its servers' sampling requests (a ``flowllm.core.interfaces.SamplingSlot``): empty until
    the task's agent binds a handler."""

    def __init__(self) -> None:
        self._handler: SamplingHandler | None = None

    def bind(self, handler: SamplingHandler | None) -> None:
        self._handler = handler

    @property
    def bound(self) -> bool:
        return self._handler is not None

    async def answer(
        self, server: str, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        """The reply for the server, or an MCP error; never raises except on cancellation."""
        handler = self._handler
        if handler is None:
            return _error(types.INVALID_REQUEST, SAMPLING_NOT_READY)
        if params.tools or params.tool_choice is not None:
            return _error(types.INVALID_PARAMS, "flowllm answers sampling requests without tools")
        try:
            messages = request_messages(params)
        except SamplingRefused as exc:
            return _error(types.INVALID_PARAMS, str(exc))
        request = SamplingRequest(
            server=server,
            messages=messages,
            system_prompt=(params.system_prompt or "").strip(),
            max_tokens=params.max_tokens,
        )
        try:
            reply = await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a provider that failed for good: the server hears it, the task goes on
            log.debug("sampling request of tool server %s failed", server, exc_info=True)
            return _error(types.INTERNAL_ERROR, f"the model call failed: {_one_line(exc)}")
        return message_result(reply)
