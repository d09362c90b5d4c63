"""What a GAIA-shaped run's input costs under each context policy, against the cache-optimal bound.

Conversations shaped like GAIA agent runs (seeded): 20-60 turns, tool results of 1k-20k tokens, now and then
two calls at once, a sub-agent that works 5-10 turns while the main agent waits, a few tools that take longer
than the 5-minute cache TTL. Each turn is built as flowllm builds it - the policy's request view of the history
(``trim_history``, or the history ``compact_history`` rewrote), ``mark_cache``'s breakpoints and the provider's
own ``build_request`` - for Anthropic's Messages API, OpenAI's Chat Completions and Responses APIs. The bodies
go, in time order on a simulated clock, through the emulator's prompt cache (flowllm/emulator/prompt_cache.py:
what the providers document) for what they are billed, and through ``flowllm.spend.cache_bound`` for the least
the same prompts could cost. Input cost only (output is the same under every policy); prices of Claude Sonnet
4.5 and GPT-5 per million tokens.

    python -m benchmarks.cache [--quick]
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from benchmarks.common import Section, Sizes, Target, md_table
from flowllm.config.provider_schema import CacheConfig, ProviderConfig, ThinkingConfig
from flowllm.core.types import Block, Message, ToolSpec
from flowllm.emulator import anthropic_wire, openai_chat_wire, openai_responses_wire
from flowllm.emulator.prompt_cache import PromptCache
from flowllm.nodes.cache import MarkCache
from flowllm.nodes.compaction import SUMMARY_TAG, CompactHistory, split_summary
from flowllm.nodes.history import fit_budget, trim_tool_results
from flowllm.nodes.tokens import count_context
from flowllm.providers import build_provider
from flowllm.providers.base import BaseProvider
from flowllm.spend.cache_bound import InputBill, cache_bound, sent_prompt, total
from flowllm.spend.pricing import Price

WIRES = {
    "anthropic": ("claude-sonnet-4-5", Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)),
    "openai_chat": ("gpt-5", Price(input=1.25, output=10.0, cache_read=0.125, cache_write=1.25)),
    "openai_responses": ("gpt-5", Price(input=1.25, output=10.0, cache_read=0.125, cache_write=1.25)),
}
PARSERS = {
    "anthropic": anthropic_wire.parse_request,
    "openai_chat": openai_chat_wire.parse_request,
    "openai_responses": openai_responses_wire.parse_request,
}
BUDGET = 64_000  # tokens: the budget and compaction policies' threshold
DEFAULT = "none"
TARGET = 1.05


@dataclass(frozen=True)
class Policy:
    name: str
    keep: int = -1  # agent.keep_tool_result
    block: int = 1  # agent.trim_block
    budget: int | None = None  # agent.max_context_tokens
    compact: bool = False  # agent.compaction.enabled at BUDGET tokens, keep_turns 2


POLICIES = (
    Policy("none"),
    Policy("keep-last-5", keep=5),
    Policy("keep-last-5, trim_block=5", keep=5, block=5),
    Policy("trimming to 64k", budget=BUDGET),
    Policy("trimming to 64k, trim_block=5", budget=BUDGET, block=5),
    Policy("compaction at 64k", compact=True),
)


@dataclass
class Step:
    """One model call of a conversation: who calls, the assistant reply it gets, the results that answer it."""

    agent: str
    reply: Message
    results: Message | None
    wait_s: float  # model time plus tool time before the next call of this agent


@dataclass
class Conversation:
    task: str
    system: list[Block]
    sub_system: list[Block]
    tools: list[ToolSpec]
    steps: list[Step] = field(default_factory=list)


def _text(rng: random.Random, tag: str, tokens: int) -> str:
    words = " ".join(f"{tag}{rng.randrange(10**6)}" for _ in range(max(tokens // 3, 1)))
    return words[: tokens * 4].ljust(tokens * 4, ".")


def _tools(rng: random.Random) -> list[ToolSpec]:
    names = ("search", "fetch_page", "run_python", "read_file", "transcribe", "delegate")
    schema = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    return [
        {"server": "tool-gaia", "name": n, "description": _text(rng, n, 120), "input_schema": schema} for n in names
    ]


def _turn(rng: random.Random, agent: str, n: int, calls: int, tool: str, result_tokens: Callable[[], int]) -> Step:
    ids = [f"toolu_{agent}_{n}_{k}" for k in range(calls)]
    reply: Message = {
        "role": "assistant",
        "content": [{"type": "text", "text": _text(rng, "think", rng.randint(60, 300))}]
        + [
            {"type": "tool_use", "id": i, "name": f"tool-gaia-{tool}", "input": {"query": f"q{n}-{k}"}}
            for k, i in enumerate(ids)
        ],
    }
    results: Message = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": i,
                "content": [{"type": "text", "text": _text(rng, "r", result_tokens())}],
                "is_error": False,
            }
            for i in ids
        ],
    }
    slow = rng.random() < 0.05  # a long download or computation: past the 5-minute TTL
    return Step(agent, reply, results, rng.uniform(5, 20) + (rng.uniform(330, 420) if slow else rng.uniform(2, 60)))


def conversation(seed: int) -> Conversation:
    """A GAIA-shaped task: the main agent's turns, with a sub-agent's turns where it delegates."""
    rng = random.Random(seed)
    sizes = lambda: int(10 ** rng.uniform(3, 4.3))  # noqa: E731 - 1k to 20k tokens, log-uniform
    conv = Conversation(
        task=_text(rng, "task", 300),
        system=[{"type": "text", "text": _text(rng, "sys", 2500)}],
        sub_system=[{"type": "text", "text": _text(rng, "sub", 1500)}],
        tools=_tools(rng),
    )
    turns = rng.randint(20, 60)
    delegate_at = rng.randint(5, turns // 2)
    for n in range(1, turns):
        if n == delegate_at:
            for m in range(1, rng.randint(5, 10)):
                conv.steps.append(_turn(rng, "sub", m, 1, "fetch_page", sizes))
            conv.steps.append(
                Step(
                    "sub",
                    {"role": "assistant", "content": [{"type": "text", "text": _text(rng, "found", 800)}]},
                    None,
                    10,
                )
            )
            conv.steps.append(_turn(rng, "main", n, 1, "delegate", lambda: 1000))
            continue
        calls = 2 if rng.random() < 0.15 else 1
        conv.steps.append(_turn(rng, "main", n, calls, rng.choice(("search", "fetch_page", "run_python")), sizes))
    conv.steps.append(
        Step("main", {"role": "assistant", "content": [{"type": "text", "text": "\\boxed{42}"}]}, None, 10)
    )
    return conv


def _compact(history: list[Message], system: list[Block], tools: list[ToolSpec]) -> list[Message]:
    """What compact_history leaves (its summary call is left out: the same under every wire)."""
    node = CompactHistory(threshold_tokens=BUDGET, keep_turns=2)
    if count_context(system, history, tools, None).tokens <= BUDGET:
        return history
    split = node.split_point(history)
    if split is None:
        return history
    task, earlier = split_summary(history[0])
    summary = f'<{SUMMARY_TAG} turns="{split}">\n{earlier[:2000]}{"s" * 4000}\n</{SUMMARY_TAG}>'
    return [{"role": "user", "content": [*task["content"], {"type": "text", "text": summary}]}, *history[split:]]


def _request(policy: Policy, history: list[Message], system: list[Block], tools: list[ToolSpec]) -> list[Message]:
    if policy.budget is not None:
        return fit_budget(history, system, tools, policy.budget, keep=policy.keep, block=policy.block)[0]
    return trim_tool_results(history, policy.keep, policy.block)


def _provider(wire: str) -> BaseProvider:
    model = WIRES[wire][0]
    cfg = ProviderConfig(
        name="bench", protocol=wire, model=model, thinking=ThinkingConfig(mode="disabled"), cache=CacheConfig()
    )
    return build_provider(cfg, base_url="http://127.0.0.1:9", api_key="bench")


def bill(conv: Conversation, policy: Policy, wire: str) -> tuple[InputBill, InputBill]:
    """(billed, bound) for the conversation's input under ``policy`` on ``wire``."""
    provider = _provider(wire)
    ctx: Any = SimpleNamespace(provider=provider)
    marker = MarkCache()
    cache = PromptCache(clock=lambda: clock[0])
    clock = [0.0]
    histories: dict[str, list[Message]] = {"main": [{"role": "user", "content": [{"type": "text", "text": conv.task}]}]}
    billed, prompts = InputBill(), []
    for step in conv.steps:
        history = histories.setdefault(
            step.agent, [{"role": "user", "content": [{"type": "text", "text": f"Find: {conv.task[:400]}"}]}]
        )
        system = conv.system if step.agent == "main" else conv.sub_system
        if policy.compact:
            history[:] = _compact(history, system, conv.tools)
        marked = marker.run(ctx, _request(policy, history, system, conv.tools), system, conv.tools)
        body = provider.build_request(
            system=marked["prompt_system"], messages=marked["prompt_messages"], tools=marked["prompt_tools"]
        )
        parsed = PARSERS[wire](body)
        use = (
            cache.anthropic("org", parsed.model, parsed.units)
            if wire == "anthropic"
            else cache.openai("org", body, parsed.units)
        )
        billed.add(InputBill(use.prompt_tokens, use.read, use.written))
        prompt = sent_prompt(wire, body, clock[0])
        assert prompt is not None
        prompts.append(prompt)
        history.append(step.reply)
        if step.results is not None:
            history.append(step.results)
        clock[0] += step.wait_s
    return billed, total(cache_bound(prompts))


def measure(tasks: int) -> dict[str, dict[str, dict[str, float]]]:
    """policy -> wire -> billed and bound USD, summed over ``tasks`` conversations."""
    convs = [conversation(seed) for seed in range(tasks)]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for policy in POLICIES:
        for wire, (_, price) in WIRES.items():
            cell = {"billed": 0.0, "bound": 0.0, "tokens": 0.0, "read": 0.0}
            for conv in convs:
                billed, bound = bill(conv, policy, wire)
                cell["billed"] += billed.cost(price)
                cell["bound"] += bound.cost(price)
                cell["tokens"] += billed.prompt_tokens
                cell["read"] += billed.read
            out.setdefault(policy.name, {})[wire] = cell
    return out


def section(figures: dict[str, dict[str, dict[str, float]]], tasks: int) -> Section:
    rows = []
    for policy, wires in figures.items():
        for wire, cell in wires.items():
            none = figures[DEFAULT][wire]["billed"]
            rows.append(
                [
                    policy,
                    wire,
                    f"{cell['tokens']:,.0f}",
                    f"{cell['read'] / cell['tokens']:.1%}",
                    f"${cell['billed']:.2f}",
                    f"${cell['bound']:.2f}",
                    f"{cell['billed'] / cell['bound']:.3f}x",
                    f"{1 - cell['billed'] / none:+.1%}" if policy != DEFAULT else "-",
                ]
            )
    headers = [
        "policy",
        "wire",
        "input tokens",
        "read from cache",
        "billed input",
        "bound",
        "billed / bound",
        "saving vs none",
    ]
    targets = []
    for wire in ("anthropic", "openai_chat"):
        ratio = figures[DEFAULT][wire]["billed"] / figures[DEFAULT][wire]["bound"]
        targets.append(
            Target(
                f"default policy (none) vs the cache-optimal bound, {wire}",
                f"<= {TARGET}x",
                f"{ratio:.3f}x",
                ratio <= TARGET,
            )
        )
    k5 = figures["keep-last-5"]["anthropic"]
    none_bound = figures[DEFAULT]["anthropic"]["bound"]
    notes = [
        f"keep-last-5 trimming (MiroThinker's: one more tool result blanked every turn) on Anthropic's wire: "
        f"${k5['billed']:.2f} billed, {k5['billed'] / k5['bound']:.2f}x its own prompts' bound and "
        f"{k5['billed'] / none_bound:.2f}x the untrimmed conversation's bound; in blocks of 5 "
        f"(agent.trim_block=5) the same trimming bills "
        f"${figures['keep-last-5, trim_block=5']['anthropic']['billed']:.2f}."
    ]
    intro = (
        f"`python -m benchmarks.cache`: {tasks} GAIA-shaped conversations (seeded; 20-60 turns, tool results of "
        "1k-20k tokens, a sub-agent of 5-10 turns, 5% of tools slower than the 5-minute TTL), each turn built as "
        "flowllm builds it (the policy's history view, mark_cache, the provider's own request) and billed by the "
        "emulator's prompt cache on a simulated clock, against `flowllm.spend.cache_bound` for the same prompts "
        "(each distinct prefix token written once and read after, within the TTL). Input cost only; Claude Sonnet "
        "4.5 and GPT-5 prices. The saving is input cost against no policy; what a policy does to accuracy is "
        "not measured here."
    )
    return Section(
        "Prompt caching: context policies against the cache-optimal bound",
        intro,
        [md_table(headers, rows)],
        notes,
        targets,
        {"figures": figures},
    )


def run(sizes: Sizes) -> Section:
    tasks = 2 if sizes.runs <= 1 else 8
    return section(measure(tasks), tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cache", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 conversations instead of 8")
    args = parser.parse_args(argv)
    print(run(Sizes.quick() if args.quick else Sizes.full()).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
