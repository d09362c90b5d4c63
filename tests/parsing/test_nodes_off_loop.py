"""The parse and repair nodes never hold the event loop, and a task's timeout can stop them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowllm.core.types import ModelResponse
from flowllm.nodes.toolcalls import OFF_LOOP_CHARS, ParseToolCalls, RepairArguments
from flowllm.parsing import ToolCall
from flowllm.parsing.safety import DEFAULT_MAX_CHARS

# Linear now, but 100 KB of it still takes the parser a while: long enough to watch the loop go on.
_SLOW_REPLY = '{"name": "x", ' + "[" * 100_000
_SLOW_ARGS = '{"a": ' + '"' * 100_000


def _response(text: str) -> ModelResponse:
    return ModelResponse(text=text, stop_reason="end_turn")


async def _ticks_while(coro: Any) -> tuple[Any, int]:
    """Run ``coro`` next to a task that counts event-loop iterations; return its result and the count."""
    ticks = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks
        while not stop:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        result = await coro
    finally:
        stop = True
        await task
    return result, ticks


def test_a_large_reply_is_parsed_while_other_tasks_run() -> None:
    node = ParseToolCalls()

    async def main() -> tuple[Any, int]:
        return await _ticks_while(node.run(None, _response(_SLOW_REPLY), []))  # type: ignore[arg-type]

    out, ticks = asyncio.run(main())
    assert out["tool_calls"] == [] and isinstance(out["bad_tool_calls"], list)
    assert ticks > 1  # inline, the parse would have finished before the ticker's first step


def test_large_arguments_are_repaired_while_other_tasks_run() -> None:
    node = RepairArguments(stages=None)
    calls = [ToolCall("call_0", None, "f", _SLOW_ARGS)]

    async def main() -> tuple[Any, int]:
        return await _ticks_while(node.run(None, calls))  # type: ignore[arg-type]

    out, ticks = asyncio.run(main())
    (prepared,) = out["prepared_calls"]
    assert isinstance(prepared.ok, bool)
    assert ticks > 1


def test_a_small_reply_stays_on_the_loop() -> None:
    reply = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    assert len(reply) < OFF_LOOP_CHARS

    async def main() -> tuple[Any, int]:
        return await _ticks_while(ParseToolCalls().run(None, _response(reply), []))  # type: ignore[arg-type]

    out, ticks = asyncio.run(main())
    assert [c.name for c in out["tool_calls"]] == ["f"]
    assert ticks == 0  # no thread hand-off for microseconds of work


def test_a_timeout_cancels_a_parse_in_progress() -> None:
    async def main() -> bool:
        task = asyncio.create_task(ParseToolCalls().run(None, _response(_SLOW_REPLY), []))  # type: ignore[arg-type]
        for _ in range(3):
            await asyncio.sleep(0)  # the node is now waiting on its worker thread
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled()

    assert asyncio.run(main())


def test_the_limit_is_configurable_and_checked() -> None:
    reply = '<tool_call>{"name": "f", "arguments": {}}</tool_call>' + " " * 100

    async def main(node: ParseToolCalls) -> dict[str, Any]:
        return await node.run(None, _response(reply), [])  # type: ignore[arg-type]

    out = asyncio.run(main(ParseToolCalls(max_chars=50)))
    assert not out["tool_calls"] and "limit of 50" in out["bad_tool_calls"][0].reason
    assert asyncio.run(main(ParseToolCalls()))["tool_calls"]
    assert ParseToolCalls().max_chars == DEFAULT_MAX_CHARS
    for bad in (0, -1, "big", True):
        with pytest.raises(ValueError, match="max_chars"):
            ParseToolCalls(max_chars=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_chars"):
            RepairArguments(max_chars=bad)  # type: ignore[arg-type]
    repaired = asyncio.run(RepairArguments(max_chars=10).run(None, [ToolCall("c", None, "f", '{"a": "long text"}')]))  # type: ignore[arg-type]
    assert repaired["prepared_calls"][0].error.startswith("the text is 18 characters")
