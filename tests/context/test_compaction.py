"""compact_history: older turns become a model-written summary, and the next request is still accepted by the
emulator's strict validation of each protocol (tool pairing, thinking signatures, reasoning items)."""

from __future__ import annotations

from typing import Any

import pytest

from flowllm.agent.loop import Agent
from flowllm.agent.results import AgentSettings
from flowllm.config.plain import plain_config
from flowllm.core.interfaces import CallContext
from flowllm.core.types import Message, Usage
from flowllm.engine import TurnContext, make_runner
from flowllm.engine.pipeline import pipeline_from_config
from flowllm.nodes.compaction import SUMMARY_TAG, CompactHistory, split_summary

from .conftest import PROTOCOLS, SUMMARY, ArchiveTools
from .helpers import Outputs, pairing_ok

SYSTEM = [{"type": "text", "text": "You are careful."}]


async def real_history(connect: Any, compose_cfg: Any, protocol: str, tool_protocol: str) -> tuple[Any, list[Any]]:
    """Five turns of real tool use through the emulator (signed thinking included), as the history."""
    pipeline = pipeline_from_config(plain_config(compose_cfg().pipeline))
    observer = Outputs()
    provider = connect(protocol, tool_protocol=tool_protocol, thinking="enabled")
    agent = Agent(pipeline, make_runner("graph"), AgentSettings(max_turns=5), observer=observer)
    task = "native-long" if tool_protocol == "native" else "xml-long"
    await agent.run(task, "Read every page of the archive.", provider, ArchiveTools())
    return provider, observer.turns("dispatch_tools")[4]["next_messages"]


@pytest.mark.parametrize("tool_protocol", ["native", "xml"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_the_next_request_after_compaction_is_valid(
    protocol: str, tool_protocol: str, connect: Any, compose_cfg: Any
) -> None:
    provider, history = await real_history(connect, compose_cfg, protocol, tool_protocol)
    tools = await ArchiveTools().list_tools()
    node = CompactHistory(threshold_tokens=100, keep_turns=2)
    ctx = TurnContext("native-long", 6, provider=provider)
    out = await node.run(ctx, history, SYSTEM, tools)
    compacted: list[Message] = out["messages"]
    info = out["compaction"]

    assert info["compacted"] and info["folded_turns"] == 3
    assert info["summary"] == SUMMARY  # written by the model, as agent "compactor"
    assert len(compacted) == 1 + 4 and compacted[1:] == history[-4:]  # the last two turns, verbatim
    assert compacted[0]["content"][0] == history[0]["content"][0]  # the task's own text is untouched
    summary_block = compacted[0]["content"][-1]["text"]
    assert summary_block.startswith(f'<{SUMMARY_TAG} turns="3">') and info["summary"] in summary_block
    assert pairing_ok(compacted) and compacted[1]["role"] == "assistant"
    assert isinstance(out["model_usage"], Usage) and out["model_usage"].input_tokens > 0
    assert info["raw_request"] and info["raw_response"]  # the summary call is on record

    # The compacted history, extended as the next turn would send it, passes the server's validation.
    offered = tools if tool_protocol == "native" else []
    request = provider.build_request(system=SYSTEM, messages=compacted, tools=offered)
    raw = await provider.send(request, context=CallContext(task_id="native-long", turn=6))
    assert provider.normalize(raw).usage.input_tokens > 0


async def test_a_second_compaction_folds_the_first_summary_in(connect: Any, compose_cfg: Any) -> None:
    provider, history = await real_history(connect, compose_cfg, "anthropic", "native")
    node = CompactHistory(threshold_tokens=100, keep_turns=1)
    ctx = TurnContext("native-long", 6, provider=provider)
    first = (await node.run(ctx, history[:7], SYSTEM, []))["messages"]
    second_out = await node.run(ctx, [*first, *history[7:]], SYSTEM, [])
    second = second_out["messages"]
    task, summary = split_summary(second[0])
    assert task["content"] == history[0]["content"] and summary
    assert sum(SUMMARY_TAG in b.get("text", "") for b in second[0]["content"]) == 1
    assert second[0]["meta"]["compacted_turns"] == 4 and second[1:] == history[-2:]
    # The summariser was shown the earlier summary.
    prompt = str(second_out["compaction"]["raw_request"])
    assert "Summary of the work before this transcript" in prompt


async def test_below_the_threshold_nothing_is_called(compose_cfg: Any) -> None:
    node = CompactHistory(threshold_tokens=10**6)
    history: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    out = await node.run(TurnContext("t", 1), history, SYSTEM, [])  # no provider: it must not be needed
    assert out["messages"] is history and out["compaction"]["compacted"] is False
    assert out["compaction"]["count"]["estimated"] is True
    with pytest.raises(ValueError, match="threshold"):
        CompactHistory()


@pytest.mark.parametrize("runner", ["legacy", "graph", "graph_parallel"])
async def test_compaction_switched_on_by_config_keeps_the_history_compact(
    runner: str, connect: Any, compose_cfg: Any
) -> None:
    cfg = compose_cfg(
        "agent.compaction.enabled=true", "agent.compaction.threshold_tokens=1500", "agent.compaction.keep_turns=2"
    )
    pipeline = pipeline_from_config(plain_config(cfg.pipeline))
    assert [n.folder for n in pipeline.nodes][:2] == ["01_compact_history", "02_trim_history"]
    observer = Outputs()
    agent = Agent(pipeline, make_runner(runner), AgentSettings(max_turns=6), observer=observer)
    provider = connect("openai_chat", tool_protocol="native")
    result = await agent.run("native-long", "Read every page of the archive.", provider, ArchiveTools())

    infos = [out["compaction"] for out in observer.turns("compact_history")]
    done = [i for i in infos if i["compacted"]]
    assert done, "the history passed the threshold, so it was compacted"
    # What dispatch_tools extended is the compacted history: the next turn starts from it.
    first = infos.index(done[0]) + 1
    later = observer.inputs[("main", first + 1, "compact_history")]["messages"]
    assert SUMMARY_TAG in later[0]["content"][-1]["text"]
    # The summary calls' tokens are the task's tokens too.
    calls = sum((out["response"].usage for out in observer.turns("normalize")), Usage())
    summaries = sum((Usage.from_dict(i["usage"]) for i in done), Usage())
    assert result.usage == calls + summaries
