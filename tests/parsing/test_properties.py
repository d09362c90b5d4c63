"""Properties over generated input: valid JSON is never changed, and nothing ever raises."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowllm.parsing import PRESETS, StreamingToolCallParser, parse_tool_calls, repair_arguments, repair_json
from flowllm.parsing.repair import parse_lenient

# No example database: the tests must not write into the repository, and must be deterministic.
_SETTINGS = settings(
    max_examples=150, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)

_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=15,
)
_containers = st.lists(_json, max_size=5) | st.dictionaries(st.text(max_size=8), _json, max_size=5)
_TOKENS = [*'{}[]()"\'\\:,. \n\tabxy01-_`#/*<>=', "None", "True", "```json", '"code": "', "<use_mcp_tool>",
           "</arguments>", "<arguments>", "<tool_name>t</tool_name>", "<tool_call>", "</tool_call>",
           "[TOOL_CALLS]", "<function=f>", "<parameter=p>", "<|tool_call_begin|>", "[f(a=", "\\u12"]  # fmt: skip
_junk = st.lists(st.sampled_from(_TOKENS), max_size=60).map("".join) | st.text(max_size=60)


@_SETTINGS
@given(_json, st.booleans(), st.sampled_from(list(PRESETS)))
def test_valid_json_round_trips_unchanged(value: object, ascii_only: bool, preset: str) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    r = repair_json(text, stages=list(PRESETS[preset]))
    assert r.ok and r.value == value and r.stage == "strict"


@_SETTINGS
@given(_containers, st.booleans(), st.booleans())
def test_structural_stage_alone_reads_valid_json_exactly(value: object, ascii_only: bool, indent: bool) -> None:
    # The stage that guesses most must not guess on valid input: quotes, escapes, brackets in strings.
    text = json.dumps(value, ensure_ascii=ascii_only, indent=2 if indent else None)
    assert parse_lenient(text) == (True, value)


@_SETTINGS
@given(_junk)
def test_no_input_makes_anything_raise(text: str) -> None:
    for stages in PRESETS.values():
        r = repair_json(text, stages=list(stages))
        assert r.raw == text
    r = repair_arguments(text)
    assert not r.ok or isinstance(r.value, dict)
    whole = parse_tool_calls(text)
    parser = StreamingToolCallParser()
    for i in range(0, len(text), 3):
        parser.feed(text[i : i + 3])
    assert parser.finish().to_dict() == whole.to_dict()
