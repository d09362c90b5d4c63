"""What model families refuse or need, and the request each wire protocol builds shaped to fit.

The table is small on purpose (LiteLLM's ``drop_params`` and Inspect AI's per-model handling are the wider
versions of it): only rules a provider's published API enforces, each with a test. A provider builds its
request from the config as usual; ``shape_request`` then drops, renames or rewrites what the receiving model
refuses and says what it changed (``Adjustment``), which the provider's opener logs once per run.

A ``ModelRule`` says which thinking forms a model takes (``Thinking``: Anthropic's ``enabled`` with a
``budget_tokens``, Anthropic's ``adaptive``, OpenAI's reasoning ``effort``; none of them: no thinking at all)
and which sampling parameters (``temperature``, ``top_p``, ``top_k``). ``rule_for`` finds a model's rule:

1. a pinned name prefix (``_PINNED``, e.g. ``gpt-5-chat``), first match;
2. else the model's family and version read from its name (``claude-opus-4-7`` -> claude 4.7, ``gpt-4.1`` ->
   gpt 4.1, ``o3-mini`` -> o 3): the family's row with the highest ``since`` not above that version. A version
   newer than every row, or a name without one (``claude-mythos-preview``), gets the family's newest row, so
   a model released after this table falls back on its family's newest known rules;
3. else no rule: the request goes as built (open models, compatible servers, the emulator).

What is shaped:

* Sampling parameters a model refuses are dropped, whatever the protocol (a router passes them on).
* Anthropic: thinking ``enabled`` to a model that takes only ``adaptive`` (Claude Opus 4.7 and later) is sent
  as ``adaptive`` with ``output_config.effort`` from the budget (``effort_for_budget``); ``adaptive`` to a model
  that takes only ``enabled`` (before Claude 4.6) is sent as ``enabled`` with the configured budget; thinking
  to a model without it (before Claude 3.7) is dropped.
* OpenAI: reasoning effort to a model without it (gpt-4o, gpt-4.1, gpt-5-chat) is dropped; reasoning models
  (o-series, gpt-5 and later) want ``max_completion_tokens`` instead of ``max_tokens`` on Chat.
* Chat takes ``metadata`` only with ``store: true`` (OpenAI refuses it otherwise).
* Chat templates of some open families (Mistral, Gemma) raise on a conversation whose user and assistant
  turns do not alternate, and Mistral's on tool-call ids other than 9 letters and digits: the defaults of
  ``provider.history`` for those families (flowllm/providers/wire/chat_history.py does the work).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

# The pages the rules below come from.
ANTHROPIC_EXTENDED = "https://platform.claude.com/docs/en/build-with-claude/extended-thinking"
ANTHROPIC_ADAPTIVE = "https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking"
ANTHROPIC_OPUS_4_7 = (
    "https://platform.claude.com/docs/en/about-claude/models/migration-guide#migrating-to-claude-opus-4-7"
)
ANTHROPIC_SONNET_5 = "https://platform.claude.com/docs/models/sonnet-5/migration-guide"
OPENAI_REASONING = "https://platform.openai.com/docs/guides/reasoning"
OPENAI_LATEST = "https://developers.openai.com/api/docs/guides/latest-model"


class Vendor(StrEnum):
    """Whose API a rule describes: its thinking forms are that API's fields."""

    anthropic = "anthropic"
    openai = "openai"


class Thinking(StrEnum):
    """A form of thinking a request can ask for."""

    enabled = "enabled"  # Anthropic: thinking {type: enabled, budget_tokens: N}
    adaptive = "adaptive"  # Anthropic: thinking {type: adaptive}, depth from output_config.effort
    effort = "effort"  # OpenAI: reasoning_effort (Chat), reasoning.effort (Responses)


SAMPLING = ("temperature", "top_p", "top_k")


@dataclass(frozen=True)
class ModelRule:
    """What one group of models accepts; ``label`` names the group in log lines."""

    label: str
    vendor: Vendor
    thinking: frozenset[Thinking]  # empty: the model has no thinking
    sampling: frozenset[str]  # the SAMPLING parameters it takes
    reasoning: bool = False  # OpenAI reasoning model: max_completion_tokens on Chat
    source: str = ""  # the page that states the rule


@dataclass(frozen=True)
class FamilyRow:
    """``rule`` holds for the models of ``family`` from version ``since`` on (until the next row's)."""

    family: str
    since: tuple[int, int]
    rule: ModelRule


_ALL_SAMPLING = frozenset(SAMPLING)
_OPENAI_SAMPLING = frozenset({"temperature", "top_p"})
# Extended thinking (enabled, with a budget) exists from Claude 3.7 Sonnet on (ANTHROPIC_EXTENDED); adaptive
# from Claude 4.6, where enabled is deprecated but still taken (ANTHROPIC_ADAPTIVE). Claude Opus 4.7 and every
# later model (Opus 4.8, Sonnet 5, Opus 5, Fable 5, Mythos 5, the 5.5 models) answer 400 to enabled and to
# temperature, top_p and top_k (ANTHROPIC_OPUS_4_7, ANTHROPIC_SONNET_5).
CLAUDE_NO_THINKING = ModelRule(
    "Claude before 3.7", Vendor.anthropic, frozenset(), _ALL_SAMPLING, source=ANTHROPIC_EXTENDED
)
CLAUDE_ENABLED = ModelRule(
    "Claude before 4.6", Vendor.anthropic, frozenset({Thinking.enabled}), _ALL_SAMPLING, source=ANTHROPIC_EXTENDED
)
CLAUDE_BOTH = ModelRule(
    "Claude 4.6",
    Vendor.anthropic,
    frozenset({Thinking.enabled, Thinking.adaptive}),
    _ALL_SAMPLING,
    source=ANTHROPIC_ADAPTIVE,
)
CLAUDE_ADAPTIVE = ModelRule(
    "Claude 4.7 and later",
    Vendor.anthropic,
    frozenset({Thinking.adaptive}),
    frozenset(),
    source=ANTHROPIC_OPUS_4_7,
)
# OpenAI reasoning models take no temperature or top_p and a reasoning effort (OPENAI_REASONING, OPENAI_LATEST);
# the others take sampling and no reasoning effort.
OPENAI_REASONING_MODEL = ModelRule(
    "OpenAI reasoning models",
    Vendor.openai,
    frozenset({Thinking.effort}),
    frozenset(),
    reasoning=True,
    source=OPENAI_REASONING,
)
OPENAI_CHAT_MODEL = ModelRule(
    "OpenAI models without reasoning", Vendor.openai, frozenset(), _OPENAI_SAMPLING, source=OPENAI_LATEST
)

_TABLE: tuple[FamilyRow, ...] = (
    FamilyRow("claude", (0, 0), CLAUDE_NO_THINKING),
    FamilyRow("claude", (3, 7), CLAUDE_ENABLED),
    FamilyRow("claude", (4, 6), CLAUDE_BOTH),
    FamilyRow("claude", (4, 7), CLAUDE_ADAPTIVE),
    FamilyRow("gpt", (0, 0), OPENAI_CHAT_MODEL),
    FamilyRow("gpt", (5, 0), OPENAI_REASONING_MODEL),
    FamilyRow("o", (1, 0), OPENAI_REASONING_MODEL),
)
# Names whose rule their version does not tell, first match wins (None: not an OpenAI API model).
_PINNED: tuple[tuple[str, ModelRule | None], ...] = (
    ("gpt-5-chat", OPENAI_CHAT_MODEL),  # gpt-5's chat model: no reasoning, sampling taken
    ("gpt-audio", OPENAI_CHAT_MODEL),
    ("chatgpt-", OPENAI_CHAT_MODEL),
    ("codex-mini", OPENAI_REASONING_MODEL),  # o4-mini tuned for Codex
    ("gpt-oss", None),  # open weights, served by others with their own rules
    ("gpt-j", None),
    ("gpt-neo", None),
)
# claude-opus-4-7, claude-opus-4-5-20251101, claude-sonnet-4.5 (routers), claude-mythos-preview (no version).
_CLAUDE = re.compile(r"^claude-[a-z]+(?:-(\d+)(?:[-.](\d{1,2}))?(?!\d))?")
# claude-3-7-sonnet-latest, claude-3-opus-20240229, claude-2.1.
_CLAUDE_OLD = re.compile(r"^claude-(\d+)(?:[-.](\d))?(?!\d)")
_GPT = re.compile(r"^gpt-(?:(\d+)(?:\.(\d+))?)?")
_O_SERIES = re.compile(r"^o(\d+)(?:\.(\d+))?(?:-|$)")
_MISTRAL = re.compile(r"(^|[-_/])(mistral|mixtral|ministral|devstral|magistral|codestral|pixtral)", re.I)
_GEMMA = re.compile(r"(^|[-_/])gemma", re.I)


def model_name(model: str) -> str:
    """The model's own name: lower case, without a router's vendor prefix (``openai/o3`` -> ``o3``)."""
    return model.strip().lower().rsplit("/", 1)[-1]


def _version(match: re.Match[str]) -> tuple[int, int] | None:
    major, minor = match.group(1), match.group(2)
    return None if major is None else (int(major), int(minor or 0))


def family_version(name: str) -> tuple[str, tuple[int, int] | None] | None:
    """(family, version read from the name, None when it has none) of a model name, or None."""
    for family, pattern in (("claude", _CLAUDE_OLD), ("claude", _CLAUDE), ("gpt", _GPT), ("o", _O_SERIES)):
        match = pattern.match(name)
        if match:
            return family, _version(match)
    return None


@lru_cache(maxsize=256)  # a pure function of the name, asked for every request: read once per model
def rule_for(model: str) -> ModelRule | None:
    """The rule for ``model`` (pinned prefix, else family and version: see the module's docstring), or None."""
    name = model_name(model)
    for prefix, pinned in _PINNED:
        if name.startswith(prefix):
            return pinned
    found = family_version(name)
    if found is None:
        return None
    family, version = found
    rows = [row for row in _TABLE if row.family == family]
    if version is not None:
        rows = [row for row in rows if row.since <= version] or rows[:1]
    return rows[-1].rule


def effort_for_budget(budget: int) -> str:
    """A thinking budget as an effort level, for APIs that take a level instead of tokens (OpenAI's reasoning
    effort, Anthropic's ``output_config.effort``): up to 2048 tokens ``low``, up to 16000 ``medium``, more
    ``high``."""
    if budget <= 2048:
        return "low"
    if budget <= 16000:
        return "medium"
    return "high"


@dataclass(frozen=True)
class ModelTraits:
    """What one model family needs from a request."""

    family: str = ""
    rule: ModelRule | None = None  # what the model accepts (None: not known, the request goes as built)
    alternate_roles: bool = False  # the chat template raises unless user and assistant alternate
    portable_ids: bool = False  # the chat template wants 9-character alphanumeric tool-call ids

    @property
    def reasoning(self) -> bool:
        """An OpenAI reasoning model: no sampling knobs, max_completion_tokens on Chat."""
        return self.rule is not None and self.rule.reasoning

    @property
    def adaptive_thinking(self) -> bool | None:
        """Anthropic: whether thinking {type: adaptive} exists (None: not a known Claude)."""
        if self.rule is None or self.rule.vendor is not Vendor.anthropic:
            return None
        return Thinking.adaptive in self.rule.thinking


def traits_for(model: str) -> ModelTraits:
    """The traits of the family ``model`` belongs to (none known: every field at its default)."""
    rule = rule_for(model)
    if rule is not None:
        return ModelTraits(family=rule.vendor.value, rule=rule)
    full = model.strip().lower()
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


def shape_request(
    protocol: str, model: str, request: dict[str, Any], *, budget_tokens: int = 0
) -> tuple[dict[str, Any], list[Adjustment]]:
    """``request`` as the model accepts it (a new dict; the input is not changed), and what was changed.

    ``budget_tokens``: the configured thinking budget, which an adaptive Anthropic request is sent with to a
    model without adaptive thinking (an enabled one sent as adaptive takes its effort from its own budget).
    """
    rule = rule_for(model)
    out = dict(request)
    notes: list[Adjustment] = []
    if rule is not None:
        if rule.vendor is Vendor.anthropic and protocol == "anthropic":
            notes += _anthropic_thinking(out, rule, budget_tokens)
        if rule.vendor is Vendor.openai and protocol in ("openai_chat", "openai_responses"):
            notes += _openai_reasoning(out, rule)
        notes += _sampling(out, rule)
    if protocol == "openai_chat":
        notes += _chat_fields(out, rule)
    return out, notes


def _sampling(out: dict[str, Any], rule: ModelRule) -> list[Adjustment]:
    notes: list[Adjustment] = []
    for key in SAMPLING:
        if key in out and key not in rule.sampling:
            del out[key]
            notes.append(Adjustment(key, Change.dropped, f"{rule.label} take no {key}"))
    return notes


def _anthropic_thinking(out: dict[str, Any], rule: ModelRule, budget_tokens: int) -> list[Adjustment]:
    """Thinking in a form the model takes: enabled -> adaptive (effort from the budget), adaptive -> enabled
    (the configured budget), or none at all."""
    thinking = out.get("thinking")
    if not isinstance(thinking, dict):
        return []
    kind = thinking.get("type")
    if kind not in (Thinking.enabled, Thinking.adaptive) or kind in rule.thinking:
        return []
    if kind == Thinking.enabled and Thinking.adaptive in rule.thinking:
        effort = effort_for_budget(int(thinking.get("budget_tokens") or budget_tokens))
        out["thinking"] = {"type": "adaptive"}
        out["output_config"] = {"effort": effort, **dict(out.get("output_config") or {})}
        why = f"{rule.label} take only adaptive thinking: sent as adaptive, output_config.effort={effort}"
        return [Adjustment("thinking", Change.replaced, why)]
    if kind == Thinking.adaptive and Thinking.enabled in rule.thinking:
        budget = max(int(budget_tokens), 1024)
        out["thinking"] = {"type": "enabled", "budget_tokens": budget}
        if int(out.get("max_tokens") or 0) <= budget:
            out["max_tokens"] = budget + 1
        why = f"{rule.label} take no adaptive thinking: sent as enabled, budget_tokens={budget}"
        return [Adjustment("thinking", Change.replaced, why)]
    del out["thinking"]
    return [Adjustment("thinking", Change.dropped, f"{rule.label} have no extended thinking")]


def _openai_reasoning(out: dict[str, Any], rule: ModelRule) -> list[Adjustment]:
    """No reasoning effort (Chat's ``reasoning_effort``, Responses' ``reasoning`` and the encrypted reasoning
    it asks ``include`` for) to a model that has none."""
    if Thinking.effort in rule.thinking:
        return []
    notes: list[Adjustment] = []
    for key in ("reasoning_effort", "reasoning"):
        if key in out:
            del out[key]
            notes.append(Adjustment(key, Change.dropped, f"{rule.label} take no reasoning effort"))
    include = out.get("include")
    if notes and isinstance(include, list) and "reasoning.encrypted_content" in include:
        kept = [item for item in include if item != "reasoning.encrypted_content"]
        if kept:
            out["include"] = kept
        else:
            del out["include"]
    return notes


def _chat_fields(out: dict[str, Any], rule: ModelRule | None) -> list[Adjustment]:
    notes: list[Adjustment] = []
    if rule is not None and rule.reasoning and "max_tokens" in out:
        value = out.pop("max_tokens")
        out.setdefault("max_completion_tokens", value)
        notes.append(
            Adjustment("max_tokens", Change.renamed, "sent as max_completion_tokens, which reasoning models want")
        )
    if "metadata" in out and out.get("store") is not True:
        del out["metadata"]
        reason = "Chat takes metadata only with store: true (provider.wire.store=true)"
        notes.append(Adjustment("metadata", Change.dropped, reason))
    return notes
