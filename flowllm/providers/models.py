"""What model families refuse or need, and the request each wire protocol builds shaped to fit.

The table is small on purpose (LiteLLM's ``drop_params`` and Inspect AI's per-model handling are the wider
versions of it): only rules a provider's published API enforces, each with a test. A provider builds its
request from the config as usual; ``shape_request`` then drops or renames what the receiving model refuses and
says what it changed (``Adjustment``), which the provider's opener logs once per run.

* OpenAI reasoning models (o1, o3, o4, gpt-5) on Chat take no ``temperature`` or ``top_p`` and want
  ``max_completion_tokens`` instead of ``max_tokens``; on Responses they take no ``temperature`` or ``top_p``.
* Chat takes ``metadata`` only with ``store: true`` (OpenAI refuses it otherwise).
* Anthropic's adaptive thinking exists from Claude 4.6 on; an older Claude gets thinking ``enabled`` with the
  configured budget instead.
* Chat templates of some open families (Mistral, Gemma) raise on a conversation whose user and assistant
  turns do not alternate, and Mistral's on tool-call ids other than 9 letters and digits: the defaults of
  ``provider.history`` for those families (flowllm/providers/chat_history.py does the work).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class ModelTraits:
    """What one model family needs from a request."""

    family: str = ""
    reasoning: bool = False  # OpenAI reasoning model: no sampling knobs, max_completion_tokens on Chat
    adaptive_thinking: bool | None = None  # Anthropic: whether thinking {type: adaptive} exists (None: unknown)
    alternate_roles: bool = False  # the chat template raises unless user and assistant alternate
    portable_ids: bool = False  # the chat template wants 9-character alphanumeric tool-call ids


_REASONING = re.compile(r"^(o1|o3|o4)(-|$)|^gpt-5(?!-chat)")
_CLAUDE = re.compile(r"^claude-(?:opus|sonnet|haiku)-(\d+)(?:-(\d{1,2}))?(?:-\d{8})?$")
_CLAUDE_OLD = re.compile(r"^claude-(?:\d|instant)")
_MISTRAL = re.compile(r"(^|[-_/])(mistral|mixtral|ministral|devstral|magistral|codestral|pixtral)", re.I)
_GEMMA = re.compile(r"(^|[-_/])gemma", re.I)


def model_name(model: str) -> str:
    """The model's own name: lower case, without a router's vendor prefix (``openai/o3`` -> ``o3``)."""
    return model.strip().lower().rsplit("/", 1)[-1]


def traits_for(model: str) -> ModelTraits:
    """The traits of the family ``model`` belongs to (none known: every field at its default)."""
    name = model_name(model)
    full = model.strip().lower()
    if _REASONING.search(name):
        return ModelTraits(family="openai-reasoning", reasoning=True)
    claude = _CLAUDE.match(name)
    if claude:
        version = (int(claude.group(1)), int(claude.group(2) or 0))
        return ModelTraits(family="claude", adaptive_thinking=version >= (4, 6))
    if _CLAUDE_OLD.match(name):
        return ModelTraits(family="claude", adaptive_thinking=False)
    if _MISTRAL.search(full):
        return ModelTraits(family="mistral", alternate_roles=True, portable_ids=True)
    if _GEMMA.search(full):
        return ModelTraits(family="gemma", alternate_roles=True)
    return ModelTraits()


class Change(StrEnum):
    dropped = "dropped"
    renamed = "renamed"
    replaced = "replaced"


@dataclass(frozen=True)
class Adjustment:
    """One change ``shape_request`` made, and why, in words for the log."""

    field: str
    change: Change
    reason: str

    def describe(self, provider: str, model: str) -> str:
        return f"provider '{provider}' ({model}): request field '{self.field}' {self.change}: {self.reason}"


_SAMPLING = ("temperature", "top_p")


def shape_request(
    protocol: str, model: str, request: dict[str, Any], *, budget_tokens: int = 0
) -> tuple[dict[str, Any], list[Adjustment]]:
    """``request`` as the model accepts it (a new dict; the input is not changed), and what was changed.

    ``budget_tokens``: the thinking budget an Anthropic request falls back to when adaptive thinking is not
    supported by its model.
    """
    traits = traits_for(model)
    out = dict(request)
    notes: list[Adjustment] = []
    if protocol in ("openai_chat", "openai_responses") and traits.reasoning:
        for key in _SAMPLING:
            if key in out:
                del out[key]
                notes.append(Adjustment(key, Change.dropped, "OpenAI reasoning models take no sampling settings"))
    if protocol == "openai_chat":
        if traits.reasoning and "max_tokens" in out:
            value = out.pop("max_tokens")
            out.setdefault("max_completion_tokens", value)
            notes.append(
                Adjustment("max_tokens", Change.renamed, "sent as max_completion_tokens, which reasoning models want")
            )
        if "metadata" in out and out.get("store") is not True:
            del out["metadata"]
            notes.append(
                Adjustment(
                    "metadata", Change.dropped, "Chat takes metadata only with store: true (provider.wire.store=true)"
                )
            )
    if protocol == "anthropic" and traits.adaptive_thinking is False:
        thinking = out.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "adaptive":
            budget = max(int(budget_tokens), 1024)
            out["thinking"] = {"type": "enabled", "budget_tokens": budget}
            if int(out.get("max_tokens") or 0) <= budget:
                out["max_tokens"] = budget + 1
            out.pop("temperature", None)
            notes.append(
                Adjustment(
                    "thinking",
                    Change.replaced,
                    f"adaptive thinking is not supported before Claude 4.6: sent as enabled, budget_tokens={budget}",
                )
            )
    return out, notes
