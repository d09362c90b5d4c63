"""Prompt caching as the providers document it: what a request reads from the cache, and what it writes.

Anthropic (https://docs.claude.com/en/docs/build-with-claude/prompt-caching):

* The prompt is one prefix over ``tools``, ``system`` and ``messages``, in that order; a ``cache_control``
  block (at most 4 per request, or the top-level ``cache_control`` that marks the last block) is a
  breakpoint: the prefix up to and including it is written to the cache.
* "The system automatically checks for cache hits at all previous content block boundaries (up to 20 blocks
  before your explicit breakpoint)": a request reads the longest cached prefix found that way.
* A prefix shorter than the model's minimum cacheable length is not cached (1,024 tokens for Sonnet 4.5,
  Sonnet 4, Opus 4 / 4.1 and Sonnet 3.7; 2,048 for Sonnet 4.6 and the Haiku 3 models; 4,096 for Opus 4.5 /
  4.6 and Haiku 4.5).
* An entry lives 5 minutes (``ttl: "1h"``: one hour) and every hit refreshes it; entries with a longer TTL
  must come before shorter ones. Caches are not shared between organisations (here: API keys) or models.
* ``input_tokens`` counts what comes after the last cache read or write; ``cache_creation_input_tokens``
  what was written, ``cache_read_input_tokens`` what was read.

OpenAI (https://platform.openai.com/docs/guides/prompt-caching):

* Automatic for prompts of 1,024 tokens or more; the cached part is the longest prefix seen before, in
  steps of 128 tokens past the first 1,024 (``prompt_tokens_details.cached_tokens`` on Chat Completions,
  ``input_tokens_details.cached_tokens`` on the Responses API). Writing costs nothing extra.
* Entries stay 5 to 10 minutes after their last use (here 5), ``prompt_cache_retention: "24h"`` keeps them a
  day; ``prompt_cache_key`` is combined with the prefix to route requests, so different keys do not share.

The emulator namespaces its cache by API key and, for determinism, by the task and agent a request names
(server.py), so one task never reads what a concurrent one wrote. Time is an injected clock (seconds,
monotonic): tests of the TTLs advance it instead of waiting. The emulator handles requests on one event loop,
so a request's read and write are one step, like the cache becoming available once the first response begins.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowllm.emulator.common import CacheUsage, RequestError, Unit, canonical_json, tokens

Clock = Callable[[], float]

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
ANTHROPIC_DEFAULT_MIN = 1024
# Longest matching name prefix wins; the emulator's own model caches like Sonnet 4.5.
ANTHROPIC_MIN_TOKENS = {
    "claude-opus-4-5": 4096,
    "claude-opus-4-6": 4096,
    "claude-haiku-4-5": 4096,
    "claude-sonnet-4-6": 2048,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
    "claude-haiku-3": 2048,
}
OPENAI_MIN_TOKENS = 1024
OPENAI_STEP_TOKENS = 128
OPENAI_RETENTION_SECONDS = {"in_memory": 300.0, "24h": 86400.0}


def cache_owner(api_key: str, task: str, agent: str) -> str:
    """Whose cache a request reads and writes: the providers share one across an organisation; the emulator
    keeps one per key and, when the client names them, per task and agent, so that a run's recorded usage does
    not depend on which of its concurrent tasks came first (reruns and runs on more workers record the same
    bytes). A batch item is its task's, like the same call made directly."""
    return hashlib.sha256("\x00".join([api_key, task, agent]).encode()).hexdigest()[:16]


def anthropic_min_tokens(model: str) -> int:
    """The minimum cacheable prompt length of ``model`` (the docs' table; 1,024 for any other model)."""
    name = model.lower()
    matches = [k for k in ANTHROPIC_MIN_TOKENS if name.startswith(k)]
    return ANTHROPIC_MIN_TOKENS[max(matches, key=len)] if matches else ANTHROPIC_DEFAULT_MIN


def openai_cached(matched_tokens: int) -> int:
    """What OpenAI reports cached for a prefix of ``matched_tokens`` seen before: 0 below 1,024, then
    1,024 plus whole 128-token steps."""
    if matched_tokens < OPENAI_MIN_TOKENS:
        return 0
    return OPENAI_MIN_TOKENS + (matched_tokens - OPENAI_MIN_TOKENS) // OPENAI_STEP_TOKENS * OPENAI_STEP_TOKENS


def prefix_hashes(units: Sequence[Unit]) -> tuple[list[str], list[int]]:
    """The hash and the token count of every prefix that ends at a unit boundary (index i: units[: i + 1])."""
    hashes: list[str] = []
    sizes: list[int] = []
    digest = hashlib.sha256()
    chars = 0
    for unit in units:
        digest.update(canonical_json([unit.assistant, unit.content]).encode())
        digest.update(b"\x00")
        chars += unit.chars
        hashes.append(digest.copy().hexdigest())
        sizes.append(tokens(chars))
    return hashes, sizes


@dataclass
class _Entry:
    expires: float
    ttl_s: float


@dataclass
class _Store:
    """Cache entries by (namespace, prefix hash), each with its expiry on the injected clock."""

    clock: Clock
    entries: dict[tuple[str, str], _Entry] = field(default_factory=dict)

    def live(self, namespace: str, prefix: str) -> _Entry | None:
        entry = self.entries.get((namespace, prefix))
        if entry is None or entry.expires <= self.clock():
            return None
        return entry

    def put(self, namespace: str, prefix: str, ttl_s: float) -> None:
        now = self.clock()
        old = self.entries.get((namespace, prefix))
        # A hit refreshes an entry; a shorter TTL never cuts a longer one short.
        keep = old.ttl_s if old is not None and old.expires > now and old.ttl_s > ttl_s else ttl_s
        self.entries[(namespace, prefix)] = _Entry(now + keep, keep)
        if len(self.entries) > 100_000:
            self.entries = {k: e for k, e in self.entries.items() if e.expires > now}


def breakpoint_ttls(units: Sequence[Unit]) -> list[tuple[int, str]]:
    """The breakpoints (unit index, TTL) in prompt order; a one-hour one after a five-minute one is refused."""
    marks = [(i, u.cache_ttl or "5m") for i, u in enumerate(units) if u.breakpoint]
    seen_5m = False
    for _, ttl in marks:
        if ttl == "1h" and seen_5m:
            raise RequestError(
                "a cache_control with ttl '1h' cannot come after one with ttl '5m': "
                "longer TTLs must appear before shorter ones"
            )
        seen_5m = seen_5m or ttl == "5m"
    return marks


class PromptCache:
    """The emulator's prompt caches, one store per provider, namespaced by API key and model."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or time.monotonic
        self._anthropic = _Store(self.clock)
        self._openai = _Store(self.clock)

    def anthropic(self, api_key: str, model: str, units: Sequence[Unit]) -> CacheUsage:
        """Read the longest cached prefix within the lookback of each breakpoint, then write every
        breakpoint past it that is long enough to cache."""
        marks = breakpoint_ttls(units)
        hashes, sizes = prefix_hashes(units)
        total = sizes[-1] if sizes else 0
        namespace = f"{api_key}\x00{model}"
        read_at = -1
        for index, _ in marks:
            for j in range(index, max(index - LOOKBACK_BLOCKS, -1), -1):
                if j > read_at and self._anthropic.live(namespace, hashes[j]) is not None:
                    read_at = j
                    break
        if read_at >= 0:
            entry = self._anthropic.live(namespace, hashes[read_at])
            assert entry is not None
            self._anthropic.put(namespace, hashes[read_at], entry.ttl_s)
        read = sizes[read_at] if read_at >= 0 else 0
        minimum = anthropic_min_tokens(model)
        written = written_1h = 0
        end = read
        for index, ttl in marks:
            if index <= read_at or sizes[index] < minimum:
                continue
            self._anthropic.put(namespace, hashes[index], TTL_SECONDS[ttl])
            if ttl == "1h":
                written_1h += sizes[index] - end
            written += sizes[index] - end
            end = sizes[index]
        return CacheUsage(prompt_tokens=total, read=read, written=written, written_1h=written_1h)

    def openai(self, api_key: str, body: dict[str, Any], units: Sequence[Unit]) -> CacheUsage:
        """Report the longest prefix seen before (1,024 tokens and up, in 128-token steps); then this
        prompt's prefixes are cached (and the ones it hit refreshed)."""
        hashes, sizes = prefix_hashes(units)
        total = sizes[-1] if sizes else 0
        key = body.get("prompt_cache_key")
        namespace = f"{api_key}\x00{body.get('model')}\x00{key if isinstance(key, str) else ''}"
        retention = body.get("prompt_cache_retention") or "in_memory"
        if retention not in OPENAI_RETENTION_SECONDS:
            raise RequestError(
                f"Invalid value: '{retention}'. Supported values are: 'in_memory' and '24h'.",
                param="prompt_cache_retention",
            )
        ttl_s = OPENAI_RETENTION_SECONDS[retention]
        matched = 0
        for j in range(len(hashes) - 1, -1, -1):
            if sizes[j] < OPENAI_MIN_TOKENS:
                break
            if self._openai.live(namespace, hashes[j]) is not None:
                matched = sizes[j]
                break
        if total >= OPENAI_MIN_TOKENS:
            for j, size in enumerate(sizes):
                if size >= OPENAI_MIN_TOKENS:
                    self._openai.put(namespace, hashes[j], ttl_s)
        return CacheUsage(prompt_tokens=total, read=openai_cached(matched))
