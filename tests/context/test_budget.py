"""agent.max_context_tokens: trim_history fits a token budget, counts with the provider's numbers when it has
them, and never breaks a request (checked by the emulator's strict validation of each protocol)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flowllm.agent.loop import Agent
from flowllm.agent.results import AgentSettings
from flowllm.config.plain import plain_config
from flowllm.core.types import Usage
from flowllm.engine import TurnContext, make_runner
from flowllm.engine.pipeline import pipeline_from_config
from flowllm.nodes.history import PLACEHOLDER, BudgetTrimHistory, TrimHistory, fit_budget
from flowllm.nodes.tokens import count_context, estimate_request

from .conftest import PROTOCOLS, ArchiveTools
from .helpers import Outputs, native_history, pairing_ok, xml_history

SYSTEM = [{"type": "text", "text": "You are careful."}]


@pytest.mark.parametrize("make", [native_history, xml_history], ids=["native", "xml"])
def test_a_long_history_is_brought_under_budget_oldest_results_first(make: Any) -> None:
    messages = make(40)
    before = copy.deepcopy(messages)
    full = estimate_request(SYSTEM, messages, [])
    budget = full // 3
    request, decision = fit_budget(messages, SYSTEM, [], budget)

    assert messages == before  # only the request's view is trimmed
    assert decision.before.tokens == full and decision.before.estimated
    assert decision.after.tokens <= budget and not decision.over_budget
    assert estimate_request(SYSTEM, request, []) == decision.after.tokens
    # Oldest first: the blanked results are a prefix of the tool-result messages.
    results = list(range(2, len(messages), 2))
    assert decision.blanked == results[: len(decision.blanked)] and decision.dropped_turns == 0
    # The task and the last turn (assistant + its results) are exactly as they were.
    assert request[0] == messages[0] and request[-2:] == messages[-2:]
    assert pairing_ok(request)
    assert PLACEHOLDER in str(request[2]["content"])


def test_when_blanking_is_not_enough_whole_old_turns_go_in_pairs() -> None:
    messages = native_history(30)
    tight = estimate_request(SYSTEM, [messages[0], *messages[-4:]], []) + 40
    request, decision = fit_budget(messages, SYSTEM, [], tight)
    assert decision.dropped_turns > 0 and decision.after.tokens <= tight
    assert request[0] == messages[0] and request[-2:] == messages[-2:]
    assert pairing_ok(request) and request[1]["role"] == "assistant"
    # Nothing is left to cut: the task and the last turn alone exceed a tiny budget, and the decision says so.
    _, hopeless = fit_budget(messages, SYSTEM, [], 50)
    assert hopeless.over_budget and hopeless.after.tokens > 50


def test_the_providers_count_is_used_when_the_last_call_reported_one() -> None:
    messages = native_history(3)
    usage = Usage(input_tokens=5000, output_tokens=40)
    counted = count_context(SYSTEM, messages, [], usage)
    assert counted.source == "provider_usage" and not counted.estimated
    assert counted.provider_tokens == 5040
    # Only what came after the last call (its tool results) is estimated.
    assert counted.tokens == 5040 + counted.estimated_tokens and 0 < counted.estimated_tokens < 1500
    # An estimated usage is no better than our own estimate.
    guessed = count_context(SYSTEM, messages, [], Usage(input_tokens=5000, output_tokens=40, estimated=True))
    assert guessed.source == "estimate" and guessed.estimated


def test_a_budget_from_provider_counts_trims_where_the_estimate_would_not() -> None:
    messages = native_history(4)
    budget = estimate_request(SYSTEM, messages, []) + 500
    untouched, plain = fit_budget(messages, SYSTEM, [], budget)
    assert not plain.blanked and untouched == messages
    # The provider says the conversation is much bigger than our estimate (a dense tokenizer): trim.
    _, told = fit_budget(messages, SYSTEM, [], budget, last_usage=Usage(input_tokens=budget, output_tokens=50))
    assert told.before.source == "provider_usage" and told.blanked and told.after.tokens <= budget


def test_budgeted_trim_history_is_the_same_config_entry_with_more_ports() -> None:
    plain = TrimHistory(keep_tool_result=-1)
    budgeted = TrimHistory(keep_tool_result=2, max_context_tokens=1000)
    assert type(plain) is TrimHistory and isinstance(budgeted, BudgetTrimHistory)
    out = budgeted.run(TurnContext("t", 2), native_history(10), SYSTEM, [])
    assert set(out) == {"request_messages", "context_budget"}
    assert out["context_budget"]["after"]["estimated"] is True
    with pytest.raises(ValueError, match="max_context_tokens"):
        TrimHistory(max_context_tokens=0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_budgeted_conversation_stays_valid_and_under_budget(
    protocol: str, connect: Any, compose_cfg: Any
) -> None:
    budget = 4000
    cfg = compose_cfg(f"agent.max_context_tokens={budget}")
    pipeline = pipeline_from_config(plain_config(cfg.pipeline))
    observer = Outputs()
    agent = Agent(pipeline, make_runner("graph"), AgentSettings(max_turns=20), observer=observer)
    provider = connect(protocol, tool_protocol="native", thinking="enabled")
    result = await agent.run("native-long", "Read every page of the archive.", provider, ArchiveTools())

    # Every request, trimmed or not, passed the emulator's validation (thinking signatures, tool pairing).
    assert result.answer == "done" and result.turns == 13 and result.stop == "no_tool_calls"
    decisions = [out["context_budget"] for out in observer.turns("trim_history")]
    assert any(d["blanked"] for d in decisions)
    assert all(d["before"]["source"] == "provider_usage" for d in decisions[1:])
    prompts = [out["response"].usage.input_tokens for out in observer.turns("normalize")]
    assert max(prompts) <= budget
    # Without trimming the last request would not have fit.
    assert decisions[-1]["before"]["tokens"] > budget
