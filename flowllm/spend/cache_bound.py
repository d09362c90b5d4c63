"""The cache-optimal bound of a saved conversation: the least its prompts could have cost as input.

Every prompt is cut into the units the emulator counts (flowllm/emulator/prompt_cache.py: a tool definition,
a system or message block), each prefix ending at a unit boundary hashed. The cheapest billing the providers'
rules allow is then, prompt by prompt in the order they were sent:

* read: the longest prefix an earlier prompt of the same model already had, sent within the TTL (every prompt
  that contains a prefix refreshes it), at least the minimum cacheable length (Anthropic: per model; OpenAI:
  1,024 tokens, then 128-token steps);
* written (Anthropic only; OpenAI writes at no surcharge): the part past the read that a later prompt reads
  within the TTL - each distinct prefix token written once;
* the rest billed as ordinary input.

With a TTL over five minutes (Anthropic's one-hour TTL) every write is a one-hour write, billed at its price.

Writes and reads fall on block boundaries, as Anthropic's breakpoints do; the four-breakpoint and 20-block
lookback limits are not imposed, so the bound is never above what any placement of breakpoints could reach.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flowllm.emulator import anthropic_wire, openai_chat_wire, openai_responses_wire
from flowllm.emulator.common import RequestError
from flowllm.emulator.prompt_cache import anthropic_min_tokens, openai_cached, prefix_hashes
from flowllm.spend.pricing import PER_TOKENS, Price

PARSERS = {
    "anthropic": anthropic_wire.parse_request,
    "openai_chat": openai_chat_wire.parse_request,
    "openai_responses": openai_responses_wire.parse_request,
}
DEFAULT_TTL_S = 300.0
ONE_HOUR_TTL_S = 3600.0


@dataclass(frozen=True)
class SentPrompt:
    """One prompt as sent: its prefix hashes and sizes (tokens) at unit boundaries, when, and by whom."""

    protocol: str
    model: str
    hashes: tuple[str, ...]
    sizes: tuple[int, ...]
    at: float = 0.0  # seconds, any origin
    task: str = ""  # prompts of different tasks share no cache (as the emulator keeps them, server.py)

    @property
    def tokens(self) -> int:
        return self.sizes[-1] if self.sizes else 0


def sent_prompt(protocol: str, body: Any, at: float = 0.0, task: str = "") -> SentPrompt | None:
    """The prompt of a request body of ``protocol``; None when the body is not one the API accepts."""
    parser = PARSERS.get(protocol)
    if parser is None:
        return None
    try:
        parsed = parser(body)
    except RequestError:
        return None
    hashes, sizes = prefix_hashes(parsed.units)
    return SentPrompt(protocol, parsed.model, tuple(hashes), tuple(sizes), at, task)


@dataclass
class InputBill:
    """Input tokens by how they are billed."""

    prompt_tokens: int = 0
    read: int = 0
    written: int = 0
    written_1h: int = 0  # the part of ``written`` with the one-hour TTL

    @property
    def uncached(self) -> int:
        return self.prompt_tokens - self.read - self.written

    @property
    def hit_rate(self) -> float | None:
        """The share of prompt tokens read from the cache."""
        return self.read / self.prompt_tokens if self.prompt_tokens else None

    def add(self, other: InputBill) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.read += other.read
        self.written += other.written
        self.written_1h += other.written_1h

    def cost(self, price: Price) -> float:
        """USD for the input side: uncached at the input price, reads and writes at theirs (by TTL)."""
        usd = (
            self.uncached * price.input
            + self.read * price.cache_read
            + (self.written - self.written_1h) * price.cache_write
        )
        return (usd + self.written_1h * price.one_hour_write) / PER_TOKENS


def _longest(prompt: SentPrompt, seen: dict[tuple[str, str, str], float], at: float, ttl_s: float, before: bool) -> int:
    """The longest unit prefix of ``prompt`` whose hash ``seen`` holds within ``ttl_s`` of ``at`` (an index,
    -1 for none). A prompt holding a prefix holds every shorter one, so the matches are a leading run."""
    lo, hi, best = 0, len(prompt.hashes) - 1, -1
    while lo <= hi:
        mid = (lo + hi) // 2
        when = seen.get((prompt.model, prompt.task, prompt.hashes[mid]))
        ok = when is not None and ((at - when) if before else (when - at)) <= ttl_s
        if ok:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _min_tokens(prompt: SentPrompt) -> int:
    return anthropic_min_tokens(prompt.model) if prompt.protocol == "anthropic" else 1024


def cache_bound(prompts: Sequence[SentPrompt], ttl_s: float = DEFAULT_TTL_S) -> list[InputBill]:
    """The cache-optimal bill of each prompt (in the order given; sent in order of ``at``)."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].at)
    read = [0] * len(prompts)
    last_seen: dict[tuple[str, str, str], float] = {}
    for i in order:
        p = prompts[i]
        hit = _longest(p, last_seen, p.at, ttl_s, before=True)
        tokens = p.sizes[hit] if hit >= 0 else 0
        if p.protocol == "anthropic":
            read[i] = tokens if tokens >= _min_tokens(p) else 0
        else:
            read[i] = openai_cached(tokens)
        for h in p.hashes:
            last_seen[(p.model, p.task, h)] = p.at
    bills = [InputBill(p.tokens, read[i]) for i, p in enumerate(prompts)]
    next_seen: dict[tuple[str, str, str], float] = {}
    for i in reversed(order):
        p = prompts[i]
        if p.protocol == "anthropic":
            reuse = _longest(p, next_seen, p.at, ttl_s, before=False)
            tokens = p.sizes[reuse] if reuse >= 0 else 0
            if tokens >= _min_tokens(p):
                bills[i].written = max(tokens - read[i], 0)
                bills[i].written_1h = bills[i].written if ttl_s > DEFAULT_TTL_S else 0
        for h in p.hashes:
            next_seen[(p.model, p.task, h)] = p.at
    return bills


def total(bills: Sequence[InputBill]) -> InputBill:
    out = InputBill()
    for bill in bills:
        out.add(bill)
    return out
