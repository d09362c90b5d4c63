"""The emulator's prompt cache through the official SDKs over HTTP: usage follows the providers' documented rules.

Sources: Anthropic https://docs.claude.com/en/docs/build-with-claude/prompt-caching ("How prompt caching
works", "Cache limitations", "Cache storage and sharing", "1-hour cache duration"); OpenAI
https://platform.openai.com/docs/guides/prompt-caching ("How it works", "Requirements"). The emulator counts
4 characters as a token, so a text of 4n characters is n tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from flowllm.emulator import Emulator
from flowllm.providers.factory import build_provider
from flowllm.spend.pricing import PriceTable
from tests.providers.conftest import make_cfg

MODEL = "flowllm-emulator"  # caches like Claude Sonnet 4.5: 1,024 tokens at least


class Clock:
    """The emulator's time, moved by the test: TTLs expire without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def emu(clock: Clock) -> Iterator[Emulator]:
    with Emulator({"default": [{"text": "ok"}]}, clock=clock) as emulator:
        yield emulator


def claude(emu: Emulator, key: str = "org-a") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=emu.base_url, api_key=key, max_retries=0)


def send(emu: Emulator, system: list[dict[str, Any]], *, model: str = MODEL, key: str = "org-a", **kw: Any) -> Any:
    messages = kw.pop("messages", [{"role": "user", "content": "go"}])
    reply = claude(emu, key).messages.create(model=model, max_tokens=64, system=system, messages=messages, **kw)
    return reply.usage


def block(text: str, ttl: str | None = None) -> dict[str, Any]:
    marker: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return {"type": "text", "text": text, "cache_control": marker}


def test_same_prompt_twice_writes_then_reads(emu: Emulator) -> None:
    # "On subsequent requests with the same prompt prefix, the cached content is read": 2,000 tokens of
    # system, then "go" (1 token) after the breakpoint, billed as ordinary input.
    system = [block("a" * 8000)]
    first, second = send(emu, system), send(emu, system)
    assert (first.cache_creation_input_tokens, first.cache_read_input_tokens, first.input_tokens) == (2000, 0, 1)
    assert (second.cache_creation_input_tokens, second.cache_read_input_tokens, second.input_tokens) == (0, 2000, 1)
    assert first.cache_creation.ephemeral_5m_input_tokens == 2000


def test_a_changed_prefix_misses(emu: Emulator) -> None:
    # "Changes to ... any content before the breakpoint invalidate the cache": one character differs.
    send(emu, [block("b" * 8000)])
    changed = send(emu, [block("b" * 7999 + "c")])
    assert (changed.cache_creation_input_tokens, changed.cache_read_input_tokens) == (2000, 0)


def test_ttl_expires_and_a_hit_refreshes_it(emu: Emulator, clock: Clock) -> None:
    # "The cache has a minimum 5-minute lifetime ... refreshed for no additional cost each time the cached
    # content is used"; "ttl": "1h" keeps an entry an hour.
    system = [block("d" * 8000)]
    send(emu, system)
    clock.now += 299
    assert send(emu, system).cache_read_input_tokens == 2000  # a hit at 4:59 ...
    clock.now += 299
    assert send(emu, system).cache_read_input_tokens == 2000  # ... restarted the 5 minutes
    clock.now += 301
    expired = send(emu, system)
    assert (expired.cache_creation_input_tokens, expired.cache_read_input_tokens) == (2000, 0)
    hour = [block("e" * 8000, ttl="1h")]
    assert send(emu, hour).cache_creation.ephemeral_1h_input_tokens == 2000
    clock.now += 3599
    assert send(emu, hour).cache_read_input_tokens == 2000


def test_too_short_prefixes_are_not_cached(emu: Emulator) -> None:
    # "Minimum cacheable prompt length: 1024 tokens for Claude Sonnet 4.5 ... 4096 tokens for Claude Haiku
    # 4.5 ... Shorter prompts cannot be cached, even if marked with cache_control."
    short = [block("f" * 4000)]  # 1,000 tokens
    for usage in (send(emu, short), send(emu, short)):
        assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens, usage.input_tokens) == (0, 0, 1001)
    haiku = [block("g" * 12000)]  # 3,000 tokens: enough for Sonnet 4.5, not for Haiku 4.5
    assert send(emu, haiku, model="claude-haiku-4-5").cache_creation_input_tokens == 0
    assert send(emu, haiku, model="claude-sonnet-4-5").cache_creation_input_tokens == 3000


def test_more_than_four_breakpoints_are_refused(emu: Emulator) -> None:
    # "You can define up to 4 cache breakpoints": a fifth is a 400.
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control"):
        send(emu, [block(f"{i}" * 100) for i in range(5)])
    # "Cache entries with longer TTL must appear before shorter TTLs."
    with pytest.raises(anthropic.BadRequestError, match="longer TTLs must appear before shorter ones"):
        send(emu, [block("h" * 4400), block("i" * 4400, ttl="1h")])


def test_lookback_of_twenty_blocks_and_one_cache_per_organisation(emu: Emulator) -> None:
    # "the system automatically checks for cache hits at all previous content block boundaries (up to 20
    # blocks before your explicit breakpoint)"; "caches are isolated between organizations".
    base = [{"type": "text", "text": "j" * 8000}]
    send(emu, [*base[:-1], block("j" * 8000)])
    near = [*base, *({"type": "text", "text": f"near {i}"} for i in range(18)), block("k" * 40)]
    assert send(emu, near).cache_read_input_tokens == 2000  # 19 blocks back
    far = [*base, *({"type": "text", "text": f"far {i}"} for i in range(25)), block("l" * 40)]
    assert send(emu, far).cache_read_input_tokens == 0  # 26 blocks back: out of reach
    assert send(emu, [block("j" * 8000)], key="org-b").cache_read_input_tokens == 0


def chat(emu: Emulator, text: str, **kw: Any) -> Any:
    client = openai.OpenAI(base_url=emu.openai_base_url, api_key=kw.pop("key", "org-a"), max_retries=0)
    messages = [{"role": "system", "content": text}, {"role": "user", "content": "go"}]
    return client.chat.completions.create(model="gpt-5", messages=messages, **kw).usage  # type: ignore[arg-type]


def respond(emu: Emulator, text: str, **kw: Any) -> Any:
    client = openai.OpenAI(base_url=emu.openai_base_url, api_key="org-a", max_retries=0)
    return client.responses.create(model="gpt-5", instructions=text, input="go", **kw).usage


def test_openai_caches_prefixes_from_1024_tokens_in_128_token_steps(emu: Emulator, clock: Clock) -> None:
    # "Caching is enabled automatically for prompts that are 1024 tokens or longer ... cache hits occur in
    # increments of 128 tokens"; cached_tokens counts the hit, prompt_tokens still counts every token.
    first, second = chat(emu, "m" * 6000), chat(emu, "m" * 6000)  # 1,500 + 1 tokens
    assert first.prompt_tokens_details.cached_tokens == 0
    assert (second.prompt_tokens, second.prompt_tokens_details.cached_tokens) == (1501, 1024 + 3 * 128)
    assert chat(emu, "m" * 5996 + "n").prompt_tokens_details.cached_tokens == 0  # the prefix changed
    assert chat(emu, "o" * 4000).prompt_tokens_details.cached_tokens == 0  # 1,001 tokens: never cached
    assert chat(emu, "o" * 4000).prompt_tokens_details.cached_tokens == 0
    # "prompt_cache_key ... combined with the prefix hash": another key does not share the entry.
    assert chat(emu, "m" * 6000, prompt_cache_key="other").prompt_tokens_details.cached_tokens == 0
    # "Cached prefixes generally remain active for 5 to 10 minutes of inactivity."
    clock.now += 601
    assert chat(emu, "m" * 6000).prompt_tokens_details.cached_tokens == 0
    respond(emu, "p" * 6000)
    assert respond(emu, "p" * 6000).input_tokens_details.cached_tokens == 1024 + 3 * 128


def test_a_one_hour_write_is_billed_at_twice_the_input_price(emu: Emulator) -> None:
    # "1-hour cache write tokens are 2 times the base input tokens price" (prompt caching, "Pricing"); 5-minute
    # writes 1.25 times. The reply read as flowllm reads it, then priced by the shipped table's rule.
    hour = [block("k" * 8000, ttl="1h")]
    raw = claude(emu, key="org-hour").messages.create(
        model=MODEL, max_tokens=64, system=hour, messages=[{"role": "user", "content": "go"}]
    )
    provider = build_provider(make_cfg("anthropic"), base_url=emu.base_url, api_key="org-hour")
    _, usage = provider.read_body(raw.model_dump())
    assert usage is not None and (usage.cache_write_tokens, usage.cache_write_1h_tokens) == (2000, 2000)
    table = PriceTable.from_mapping({"m": {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}})
    price = table.prices["m"]
    assert price.cost(usage) == pytest.approx((1 * 3.0 + 2000 * 6.0 + usage.output_tokens * 15.0) / 1e6)
    explicit = PriceTable.from_mapping({"m": {"input": 3.0, "output": 15.0, "cache_write_1h": 5.0}}).prices["m"]
    assert explicit.cost(usage) == pytest.approx((1 * 3.0 + 2000 * 5.0 + usage.output_tokens * 15.0) / 1e6)
    five = send(emu, [block("l" * 8000)], key="org-hour")
    assert five.cache_creation.ephemeral_1h_input_tokens == 0  # a 5-minute write stays at cache_write
