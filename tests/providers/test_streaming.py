"""Fragment merging, independent of any server."""

from __future__ import annotations

from flowllm.providers.wire.streaming import ToolCallFragments, assemble_anthropic, assemble_responses


def test_fragments_merge_by_index_overwriting_id_and_name() -> None:
    merge = ToolCallFragments()
    merge.add({"index": 1, "id": "b", "type": "function", "function": {"name": "read", "arguments": '{"p'}})
    merge.add({"index": 0, "id": "a", "type": "function", "function": {"name": "calc", "arguments": ""}})
    merge.add({"index": 1, "id": "b", "function": {"name": "read", "arguments": 'ath": 1}'}})
    merge.add({"index": 0, "function": {"arguments": '{"x": 2}'}})
    assert merge.result() == [
        {"id": "a", "type": "function", "function": {"name": "calc", "arguments": '{"x": 2}'}},
        {"id": "b", "type": "function", "function": {"name": "read", "arguments": '{"path": 1}'}},
    ]


def test_a_new_id_at_a_reused_index_starts_a_new_call() -> None:
    """Servers that send every call at index 0: two calls, never one with both argument strings."""
    merge = ToolCallFragments()
    merge.add({"index": 0, "id": "a", "type": "function", "function": {"name": "calc", "arguments": '{"x"'}})
    merge.add({"index": 0, "function": {"arguments": ": 1}"}})
    merge.add({"index": 0, "id": "b", "type": "function", "function": {"name": "read", "arguments": "{}"}})
    merge.add({"index": 0, "id": "b", "function": {"arguments": ""}})  # the id repeated: same call
    merge.add({"index": 1, "id": "c", "type": "function", "function": {"name": "calc", "arguments": "{}"}})
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in merge.result()] == [
        ("a", "calc", '{"x": 1}'),
        ("b", "read", "{}"),
        ("c", "calc", "{}"),
    ]


def test_fragments_without_index_follow_their_id_or_the_current_call() -> None:
    merge = ToolCallFragments()
    merge.add({"id": "a", "function": {"name": "calc", "arguments": "{"}})
    merge.add({"function": {"arguments": "}"}})
    merge.add({"id": "b", "function": {"name": "read", "arguments": "[]"}})
    merge.add({"id": "a", "function": {"arguments": ""}})
    assert [(c["id"], c["function"]["arguments"]) for c in merge.result()] == [("a", "{}"), ("b", "[]")]


def test_anthropic_fold_without_json_deltas_keeps_the_start_input() -> None:
    body = assemble_anthropic(
        [
            {"type": "message_start", "message": {"id": "m", "model": "x", "usage": {"input_tokens": 1}}},
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {"a": 1}},
            },
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}},
        ]
    )
    assert body["content"] == [{"type": "tool_use", "id": "t", "name": "n", "input": {"a": 1}}]
    assert body["usage"] == {"input_tokens": 1, "output_tokens": 5}


def test_responses_fold_uses_snapshot_output_when_no_item_events() -> None:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
    body = assemble_responses(
        [{"type": "response.completed", "response": {"id": "r", "status": "completed", "output": [item]}}]
    )
    assert body["output"] == [item] and body["status"] == "completed"
