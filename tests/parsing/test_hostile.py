"""Replies written to hurt the parser: nothing raises, nothing takes more than linear work.

No test here asserts on time. The hang guard is a generous alarm (a quadratic parser took minutes on these
inputs, a linear one takes well under a second); the scaling itself is asserted on operation counts.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowllm.parsing import (
    FORMATS,
    PRESETS,
    BadToolCall,
    Parsed,
    Repaired,
    StreamingToolCallParser,
    ToolCall,
    parse_tool_calls,
    repair_arguments,
    repair_json,
)
from flowllm.parsing.repair.stages import BracketMatcher
from flowllm.parsing.safety import DEFAULT_MAX_CHARS, MAX_CALL_BLOCKS
from flowllm.parsing.toolcalls import NATIVE_FORMATS


class _Hang(BaseException):
    """Not an Exception: the parser's own guards must not be able to swallow the alarm."""


@contextlib.contextmanager
def hang_guard(seconds: float = 60.0) -> Iterator[None]:
    def fire(signum: int, frame: object) -> None:
        raise _Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _fill(unit: str, size: int, head: str = "", tail: str = "") -> str:
    return head + unit * max(1, (size - len(head) - len(tail)) // len(unit)) + tail


# ------------------------------------------------------------------------------------ exceptions (issue 19.4)
DEEP = "[" * 1025 + "]" * 1025


@pytest.mark.parametrize(
    ("label", "reply"),
    [
        ("open brackets in <tool_call>", "<tool_call>" + "[" * 1025 + "</tool_call>"),
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": ' + DEEP + "}}</tool_call>"),
        ("qwen3_coder", "<tool_call><function=f><parameter=a>" + DEEP + "</parameter></function></tool_call>"),
        ("glm4", "<tool_call>f<arg_key>a</arg_key><arg_value>" + DEEP + "</arg_value></tool_call>"),
        ("mistral list", "[TOOL_CALLS]" + "[" * 1025),
        ("mistral v11", '[TOOL_CALLS]f{"a": ' + DEEP + "}"),
        ("markerless json", '{"name": "f", "arguments": {"a": ' + DEEP + "}}"),
        ("pythonic 5,000 terms", "[f(a=" + "+".join(["1"] * 5000) + ")]"),
        ("pythonic 100k dashes", "[f(a=" + "-" * 100_000 + "1)]"),
        ("lone surrogate, pythonic", '[f(a="\ud800")]'),
        ("lone surrogate, hermes", '<tool_call>{"name": "f", "arguments": {"a": "\ud800"}}</tool_call>'),
        ("dashes alone", "-" * 100_000),
    ],
)
def test_hostile_reply_is_a_result_never_an_exception(label: str, reply: str) -> None:
    with hang_guard():
        parsed = parse_tool_calls(reply)
        streamed = StreamingToolCallParser()
        for i in range(0, len(reply), 97):
            streamed.feed(reply[i : i + 97])
        assert streamed.finish().to_dict() == parsed.to_dict()
    assert isinstance(parsed, Parsed)
    for call in parsed.calls:  # a call that came through is still repaired cleanly
        r = repair_arguments(call.arguments_text)
        assert isinstance(r, Repaired)
        assert r.ok or r.error
    assert all(b.reason for b in parsed.bad)


def test_too_deep_arguments_say_so() -> None:
    parsed = parse_tool_calls("<tool_call>" + "[" * 1025 + "</tool_call>")
    assert not parsed.calls
    assert "nested too deeply" in parsed.bad[0].reason
    r = repair_arguments('{"a": ' + DEEP + "}")
    assert not r.ok and "nested too deeply" in (r.error or "")


def test_pythonic_failures_name_their_cause() -> None:
    assert "nested too deeply" in parse_tool_calls("[f(a=" + "+".join(["1"] * 5000) + ")]").bad[0].reason
    assert "out of memory" in parse_tool_calls("[f(a=" + "-" * 100_000 + "1)]").bad[0].reason
    assert "surrogate" in parse_tool_calls('[f(a="\ud800")]').bad[0].reason


def test_native_arguments_nested_past_the_encoder_are_a_bad_call() -> None:
    deep: dict[str, object] = {}
    for _ in range(5000):
        deep = {"a": deep}
    parsed = parse_tool_calls([{"type": "tool_use", "id": "t1", "name": "f", "input": deep}])
    assert not parsed.calls
    assert parsed.bad[0].reason == "tool call could not be read: nested too deeply to read"
    chat = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": ' + DEEP + "}"}}]
    (call,) = parse_tool_calls(chat).calls
    r = repair_arguments(call.arguments_text)
    assert not r.ok and "nested too deeply" in (r.error or "")
    assert not repair_arguments(deep).ok  # a dict that cannot be written back as text is refused, not raised


def test_the_size_cap_is_a_bad_call_saying_so() -> None:
    reply = '<tool_call>{"name": "f", "arguments": {}}</tool_call>' + " " * DEFAULT_MAX_CHARS
    parsed = parse_tool_calls(reply)
    assert not parsed.calls and len(parsed.bad) == 1
    assert "more than the parser's limit of 1,048,576" in parsed.bad[0].reason
    assert len(parsed.bad[0].raw) < 3000  # what is shown back is the start of the reply, not all of it
    assert parse_tool_calls(reply, max_chars=None).calls  # the limit is the caller's to raise
    r = repair_arguments('{"a": "' + "x" * DEFAULT_MAX_CHARS + '"}')
    assert not r.ok and "limit" in (r.error or "")
    streamed = StreamingToolCallParser()
    streamed.feed(reply)
    assert streamed.finish().to_dict() == parsed.to_dict()


def test_too_many_call_blocks_are_cut_with_a_bad_call() -> None:
    one = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    parsed = parse_tool_calls(one * (MAX_CALL_BLOCKS + 5))
    assert len(parsed.calls) == MAX_CALL_BLOCKS
    assert len(parsed.bad) == 1 and f"more than {MAX_CALL_BLOCKS:,}" in parsed.bad[0].reason


# Arbitrary text: any code point (lone surrogates included), call markup, and deep or unbalanced nesting.
_MARKUP = ["<use_mcp_tool>", "<tool_name>f</tool_name>", "<arguments>", "</arguments>", "</use_mcp_tool>",
           "<tool_call>", "</tool_call>", "<function=f>", "<parameter=a>", "</parameter>", "</function>",
           "<arg_key>", "</arg_key>", "<arg_value>", "[TOOL_CALLS]", "<|tool_call_begin|>",
           "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
           "<minimax:tool_call>", '<invoke name="f">', '<parameter name="a">', "</invoke>", "to=functions.f",
           "<|channel|>commentary json", "<|message|>", "<|call|>", ">>>f\n", ">>>all\n", "<|tool_call>call:f{",
           '<|"|>', "<tool_call|>", "```python\n", "```\n",
           "[f(a=", '{"name": "f", "arguments": ', "```json\n", '"', "\\", "\ud800", "\udfff", "{", "}", "[", "]",
           "(", ")", ",", ":", "-", "'", "\n"]  # fmt: skip
_pieces = st.sampled_from(_MARKUP) | st.text(st.characters(codec=None), max_size=8)
_openers = st.sampled_from(["[", "{", "(", '{"a": ', "[f(a="])
_nesting = st.tuples(_openers, st.integers(0, 1100)).map(lambda t: t[0] * t[1])
_hostile = st.lists(_pieces | _nesting, max_size=25).map("".join)
_HOSTILE_SETTINGS = settings(
    max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


def _parsed_shape(p: object) -> None:
    assert isinstance(p, Parsed)
    assert all(isinstance(c, ToolCall) for c in p.calls)
    assert all(isinstance(b, BadToolCall) and b.reason for b in p.bad)
    assert isinstance(p.content, str)


@_HOSTILE_SETTINGS
@given(_hostile)
def test_every_parser_returns_results_for_any_text(text: str) -> None:
    with hang_guard():
        _parsed_shape(parse_tool_calls(text))
        for fmt in FORMATS:
            if fmt not in NATIVE_FORMATS:
                _parsed_shape(parse_tool_calls(text, formats=[fmt]))
        streamed = StreamingToolCallParser()
        for i in range(0, len(text), 5):
            assert isinstance(streamed.feed(text[i : i + 5]), list)
        _parsed_shape(streamed.finish())
        _parsed_shape(parse_tool_calls([{"id": "c", "type": "function", "function": {"name": "f", "arguments": text}}]))
        for stages in PRESETS.values():
            r = repair_json(text, stages=list(stages))
            assert isinstance(r, Repaired) and r.raw == text and (r.ok or r.error)
        r = repair_arguments(text)
        assert isinstance(r, Repaired) and (not r.ok or isinstance(r.value, dict))
        for key in ("code", "q"):
            assert isinstance(repair_json(text, key=key), Repaired)


# ------------------------------------------------------------------------------------ linear time (issue 19.3)
# Each shape is one a quadratic parser took from tens of seconds to hours on; sizes are where a linear one
# needs well under a second.
_SHAPES = [
    ("call then [ run", parse_tool_calls, lambda: _fill("[", 100_000, '{"name": "x", ')),
    ("<use_mcp_tool without >", parse_tool_calls, lambda: _fill("<use_mcp_tool ", 1_000_000)),
    ("<parameter= without >", parse_tool_calls, lambda: _fill("<parameter=a", 1_000_000, "<function=f>")),
    ("<arg_key> without close", parse_tool_calls, lambda: _fill("<arg_key>", 1_000_000, "<tool_call>f")),
    ("kimi begin without argument marker", parse_tool_calls, lambda: _fill("<|tool_call_begin|>", 1_000_000)),
    ("[TOOL_CALLS][ run", parse_tool_calls, lambda: _fill("[TOOL_CALLS][", 1_000_000)),
    ("<tool_call>{ run", parse_tool_calls, lambda: _fill("<tool_call>{", 1_000_000)),
    ("<invoke> without close", parse_tool_calls, lambda: _fill('<invoke name="f">', 1_000_000, "<minimax:tool_call>")),
    (
        "minimax <parameter> without close",
        parse_tool_calls,
        lambda: _fill('<parameter name="a">', 1_000_000, '<minimax:tool_call><invoke name="f">'),
    ),
    ("harmony calls without end", parse_tool_calls, lambda: _fill("to=functions.f<|message|>{", 1_000_000)),
    ("gemma calls without close", parse_tool_calls, lambda: _fill("<|tool_call>call:f{a:", 1_000_000)),
    ("functionary heads", parse_tool_calls, lambda: _fill(">>>f\n{", 1_000_000)),
    ("json quotes run", parse_tool_calls, lambda: _fill('{"', 100_000, '"name": ')),
    (', "k": in a string', repair_arguments, lambda: _fill(', "k": ', 300_000, '{"a": "{')),
    ("backslash run", repair_arguments, lambda: _fill("\\", 300_000, '{"a": "')),
]


@pytest.mark.parametrize(("label", "fn", "make"), _SHAPES, ids=[s[0] for s in _SHAPES])
def test_hostile_shape_completes(label: str, fn: object, make: object) -> None:
    text = make()  # type: ignore[operator]
    with hang_guard():
        result = fn(text)  # type: ignore[operator]
    assert isinstance(result, Parsed | Repaired)


@pytest.mark.parametrize("size", [10_000, 100_000])
def test_bracket_matching_reads_the_text_a_bounded_number_of_times(size: int) -> None:
    for text in (_fill("[", size, '{"name": "x", '), _fill('{"', size), _fill('"{', size, "{")):
        matcher = BracketMatcher(text)
        for i, c in enumerate(text):
            if c in "[{":
                matcher.end(i)
        assert matcher.scanned <= 9 * len(text) + 4096


def test_streaming_rereads_a_bounded_multiple_of_the_reply() -> None:
    for text in (_fill("So {x} and [y]. ", 1_000_000), _fill("The quick brown fox. ", 1_000_000)):
        parser = StreamingToolCallParser()
        for i in range(0, len(text), 64):
            parser.feed(text[i : i + 64])
        parser.finish()
        assert parser.chars_read <= 20 * len(text)
        assert parser.passes <= 300


def test_streaming_still_hands_out_calls_before_the_end() -> None:
    call = '<tool_call>{"name": "f", "arguments": {"i": %d}}</tool_call>\n'
    text = "".join(call % i for i in range(1100))
    parser = StreamingToolCallParser()
    seen: list[ToolCall] = []
    half = 0
    for i in range(0, len(text), 64):
        seen.extend(parser.feed(text[i : i + 64]))
        if i < len(text) // 2:
            half = len(seen)
    final = parser.finish()
    assert half > 500  # long before the reply ended
    assert [json.loads(c.arguments_text)["i"] for c in final.calls] == list(range(MAX_CALL_BLOCKS))
