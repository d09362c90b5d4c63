"""vLLM's and SGLang's tool-parser cases and MiroFlow's examples (tests/corpora/tool_call_cases.jsonl).

A row passes when ``parse_tool_calls`` finds exactly the expected calls (name, server where the row names one)
and ``repair_arguments`` reads each one's arguments to the expected value. Where a peer keeps non-object
arguments as a bare value, flowllm's contract gives ``{"value": v}``: that is the same reading. Target
(issue 4): at least 95% of the rows.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from flowllm.parsing import StreamingToolCallParser, parse_tool_calls, repair_arguments
from tests.parsing._corpus import load_corpus, tools_of

ROWS = load_corpus("tool_call_cases.jsonl")

# Debatable rows where flowllm takes the documented alternative; each is asserted for what flowllm does.
ALTERNATIVES: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "tc-007": (
        "only the outer '}' is missing and the arguments are complete: flowllm mends it (a truncated reply is mended)",
        [{"name": "final_answer", "arguments": {"trigger": True}}],
    ),
}


def _expected(row: dict) -> list[dict[str, Any]]:
    out = []
    for e in row["expected"]:
        args = e["arguments"]
        out.append({"name": e["name"], "arguments": args if isinstance(args, dict) else {"value": args}})
    return out


def _got(row: dict) -> list[dict[str, Any]]:
    parsed = parse_tool_calls(row["text"], tools=tools_of(row))
    out = []
    for call, exp in zip(parsed.calls, row["expected"] + [{}] * len(parsed.calls), strict=False):
        r = repair_arguments(call.arguments_text)
        assert r.ok, f"{call.name}: {r.error}"
        if "server_name" in exp:
            assert call.server == exp["server_name"]
        out.append({"name": call.name, "arguments": r.value})
    return out


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_row(row: dict) -> None:
    if row["id"] in ALTERNATIVES:
        _reason, expected = ALTERNATIVES[row["id"]]
    else:
        expected = _expected(row)
    assert _got(row) == expected


def test_pass_rate_meets_target() -> None:
    passed = 0
    for row in ROWS:
        with contextlib.suppress(AssertionError):  # a failed read inside _got counts as a miss
            passed += _got(row) == _expected(row)
    assert passed / len(ROWS) >= 0.95, f"{passed}/{len(ROWS)}"


STREAMED = [r for r in ROWS if r.get("chunks")]


@pytest.mark.parametrize("row", STREAMED, ids=[r["id"] for r in STREAMED])
def test_streaming_matches_one_shot(row: dict) -> None:
    assert "".join(row["chunks"]) == row["text"]
    tools = tools_of(row)
    parser = StreamingToolCallParser(tools=tools)
    streamed = []
    for chunk in row["chunks"]:
        streamed.extend(parser.feed(chunk))
    final = parser.finish()
    whole = parse_tool_calls(row["text"], tools=tools)
    assert final.to_dict() == whole.to_dict()
    # Each call came out exactly once, in order; a cut-off one only when the reply was over.
    assert streamed == whole.calls[: len(streamed)]
    if not row.get("partial"):
        assert streamed == whole.calls


@pytest.mark.parametrize("row", [r for r in ROWS if "expected_content_contains" in r], ids=lambda r: r["id"])
def test_prose_around_calls_is_kept(row: dict) -> None:
    assert row["expected_content_contains"] in parse_tool_calls(row["text"], tools=tools_of(row)).content
