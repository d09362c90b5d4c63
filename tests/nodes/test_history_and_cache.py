"""trim_history and mark_cache: what reaches the model, and that the history itself is never changed."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from flowllm.core.types import Message
from flowllm.engine import TurnContext
from flowllm.nodes.cache import MarkCache
from flowllm.nodes.history import PLACEHOLDER, TrimHistory


def xml_results(n: int) -> Message:
    return {
        "role": "user",
        "content": [{"type": "text", "text": f'<tool_result server="s" tool="t">\nresult {n}\n</tool_result>'}],
        "meta": {"kind": "tool_results", "calls": [{"server": "s", "tool": "t"}]},
    }


def native_results(n: int) -> Message:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": f"id{n}", "content": [{"type": "text", "text": f"r{n}"}]}],
    }


def history(make) -> list[Message]:
    messages: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "the task"}]}]
    for n in range(4):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"call {n}"}]})
        messages.append(make(n))
    return messages


def texts(message: Message) -> list[str]:
    out = []
    for block in message["content"]:
        if block["type"] == "tool_result":
            out.extend(b["text"] for b in block["content"])
        else:
            out.append(block["text"])
    return out


def test_keeps_the_last_k_tool_results_and_the_task() -> None:
    for make in (xml_results, native_results):
        messages = history(make)
        before = copy.deepcopy(messages)
        out = TrimHistory(keep_tool_result=1).run(TurnContext("t", 1), messages)["request_messages"]
        assert messages == before  # the history is untouched; only the request's view is trimmed
        assert out[0] == messages[0]
        assert [texts(m) == [PLACEHOLDER] for m in out[2::2]] == [True, True, True, False]
        # Native blocks keep their ids, so every tool_use still has its tool_result.
        if make is native_results:
            assert [m["content"][0]["tool_use_id"] for m in out[2::2]] == ["id0", "id1", "id2", "id3"]


def test_minus_one_keeps_everything_and_zero_blanks_all() -> None:
    messages = history(xml_results)
    assert TrimHistory(-1).run(TurnContext("t", 1), messages)["request_messages"] is messages
    out = TrimHistory(0).run(TurnContext("t", 1), messages)["request_messages"]
    assert all(texts(m) == [PLACEHOLDER] for m in out[2::2])


@dataclass
class CachingProvider:
    supports_cache_control: bool


def test_mark_cache_marks_system_and_last_user_message() -> None:
    messages = history(xml_results)
    system = [{"type": "text", "text": "sys"}]
    ctx = TurnContext("t", 1, provider=CachingProvider(True))  # type: ignore[arg-type]
    tools = [{"server": "s", "name": n, "description": "", "input_schema": {"type": "object"}} for n in ("a", "b")]
    out = MarkCache(ttl="1h").run(ctx, messages, system, tools)
    assert [t.get("cache_control") for t in out["prompt_tools"]] == [None, {"type": "ephemeral", "ttl": "1h"}]
    assert "cache_control" not in tools[1]
    assert out["prompt_system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert out["prompt_messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert sum("cache_control" in b for m in out["prompt_messages"] for b in m["content"]) == 1
    assert "cache_control" not in messages[-1]["content"][-1] and "cache_control" not in system[0]
    # Fewer breakpoints keep the ones that pay most: the last user message first.
    one = MarkCache(breakpoints=1).run(ctx, messages, system, tools)
    assert "cache_control" not in one["prompt_system"][-1] and "cache_control" not in one["prompt_tools"][-1]
    assert one["prompt_messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_a_turn_of_twenty_blocks_or_more_also_marks_the_previous_turns_write() -> None:
    """Anthropic looks back at most 20 blocks from a breakpoint: 24 parallel tool results would hide what the
    previous turn wrote, so its user message gets the fourth breakpoint."""
    messages = history(native_results)
    calls = [{"type": "tool_use", "id": f"w{k}", "name": "t", "input": {}} for k in range(24)]
    messages += [
        {"role": "assistant", "content": calls},
        {"role": "user", "content": [native_results(k)["content"][0] for k in range(24)]},
    ]
    ctx = TurnContext("t", 1, provider=CachingProvider(True))  # type: ignore[arg-type]
    out = MarkCache().run(ctx, messages, [{"type": "text", "text": "sys"}], [])
    marked = [i for i, m in enumerate(out["prompt_messages"]) if any("cache_control" in b for b in m["content"])]
    assert marked == [8, 10]


def test_trim_block_blanks_old_results_a_block_at_a_time() -> None:
    """keep_tool_result=1, trim_block=2: between 1 and 2 results stay whole, so the request's prefix changes
    every second result, not on every turn."""
    messages = [history(native_results)[0]]
    blanked = []
    for n in range(6):
        messages += [{"role": "assistant", "content": [{"type": "text", "text": f"call {n}"}]}, native_results(n)]
        out = TrimHistory(keep_tool_result=1, trim_block=2).run(TurnContext("t", 1), messages)["request_messages"]
        blanked.append(sum(texts(m) == [PLACEHOLDER] for m in out[2::2]))
    assert blanked == [0, 0, 2, 2, 4, 4]


def test_mark_cache_leaves_providers_without_cache_control_alone() -> None:
    messages = history(xml_results)
    ctx = TurnContext("t", 1, provider=CachingProvider(False))  # type: ignore[arg-type]
    out = MarkCache().run(ctx, messages, [], [])
    assert out["prompt_messages"] is messages
