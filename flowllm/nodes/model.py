"""call_model and normalize: the only model I/O of a turn, and its translation into a ModelResponse.

They are two nodes so that the raw wire exchange is always on disk: replay and re-normalisation start from it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from flowllm.core.interfaces import Provider
from flowllm.core.types import Block, Message, ModelResponse, ToolSpec
from flowllm.engine import Node, TurnContext


def _provider(ctx: TurnContext) -> Provider:
    if ctx.provider is None:
        raise RuntimeError("no provider was given to this turn")
    return ctx.provider


class CallModel(Node):
    """(prompt_messages, prompt_system, prompt_tools) -> (raw_request, raw_response) through the provider's SDK."""

    outputs = ("raw_request", "raw_response")

    async def run(
        self,
        ctx: TurnContext,
        prompt_messages: list[Message],
        prompt_system: list[Block],
        tools: list[ToolSpec],
    ) -> dict[str, Any]:
        provider = _provider(ctx)
        # The text protocol teaches tools in the system prompt; only the native one sends schemas.
        offered = tools if provider.tool_protocol == "native" else []
        request = provider.build_request(system=prompt_system, messages=prompt_messages, tools=offered)
        raw = await provider.send(request, context=ctx.call_context)
        return {"raw_request": request, "raw_response": raw}


class Normalize(Node):
    """raw_response -> response (ModelResponse), the same whichever protocol answered."""

    outputs = ("response",)
    output_types = MappingProxyType({"response": ModelResponse})

    def run(self, ctx: TurnContext, raw_response: dict[str, Any]) -> dict[str, Any]:
        return {"response": _provider(ctx).normalize(raw_response)}
