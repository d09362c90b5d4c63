"""degrade_media: images, audio and other binary content reach a model only if it accepts them natively.

Tool results (and task attachments) may carry media blocks (``{"type": "image" | "audio" | "document" | "file",
"media_type": ..., "data": base64}``). A provider that accepts a kind gets it as is; for any other kind the
block becomes a text description: what it was, its size and dimensions or duration, a content hash, and where
the original is. Only the request is changed (this is a ``before_model`` hook): the history, and so the run's
artifacts (``dispatch_tools``' ``tool_results`` and ``next_messages``), keep every original byte.

What a provider accepts is asked of the provider: ``Provider.accepted_media`` (``provider.accepts`` in its
config minus ``text``, e.g. ``[text]`` for DeepSeek and most local models; wrappers such as the resilient chain
and replay declare their primary's). ``accept: [...]`` in the node's config overrides it, e.g. ``accept: []``
for a text-only model served over a protocol that could carry images.

No hook has to be switched on for a text-only model: every provider applies ``degrade_messages`` to its own
request for the media it does not accept (``BaseProvider.sendable``). Listing the hook as well records what was
replaced (its ``degraded`` output) and lets ``accept`` narrow it further:

    python -m flowllm 'pipeline.hooks.before_model=[degrade_media]'
"""

from __future__ import annotations

from typing import Any

from flowllm.core.interfaces import Provider
from flowllm.core.media import MEDIA_TYPES, degrade_messages, describe_media
from flowllm.core.types import Message
from flowllm.engine import Node, TurnContext

# What a turn without a provider (a pipeline tested on its own) is taken to accept: all three protocols carry images.
NO_PROVIDER_MEDIA = frozenset({"image"})


def accepted_media(provider: Provider | None, override: list[str] | None = None) -> set[str]:
    """The media block types ``provider`` takes natively (see the module doc)."""
    if override is not None:
        return {str(kind) for kind in override}
    return set(provider.accepted_media if provider is not None else NO_PROVIDER_MEDIA)


class DegradeMedia(Node):
    """prompt_messages -> (prompt_messages, degraded): media the provider cannot take, as text."""

    outputs = ("prompt_messages", "degraded")

    def __init__(self, accept: list[str] | None = None) -> None:
        self.accept = list(accept) if accept is not None else None

    def run(self, ctx: TurnContext, prompt_messages: list[Message]) -> dict[str, Any]:
        accepted = accepted_media(ctx.provider, self.accept)
        messages, report = degrade_messages(prompt_messages, accepted)
        return {"prompt_messages": messages, "degraded": report}


__all__ = ["MEDIA_TYPES", "NO_PROVIDER_MEDIA", "DegradeMedia", "accepted_media", "degrade_messages", "describe_media"]
