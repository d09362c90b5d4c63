"""The JSON Schema subset the pool checks before a call: what a model is told when its arguments are off."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowllm.tools.client.validation import describe_signature, validate_arguments

# The shape pydantic (and so MCPServer) emits, including Optional as anyOf and nested models as $ref.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "minLength": 1},
        "count": {"type": "integer", "minimum": 0, "maximum": 10},
        "ratio": {"type": "number"},
        "mode": {"enum": ["fast", "exact"]},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "point": {"$ref": "#/$defs/Point"},
    },
    "required": ["code", "count"],
    "$defs": {
        "Point": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
            "additionalProperties": False,
        }
    },
}


def test_valid_arguments_pass() -> None:
    args = {
        "code": "print(1)",
        "count": 3,
        "ratio": 0.5,
        "mode": "fast",
        "flags": [True],
        "note": None,
        "point": {"x": 1, "y": 2.5},
    }
    assert validate_arguments(args, SCHEMA) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"count": 1}, "missing required argument 'code' (string)"),
        ({"code": "x", "count": "3"}, "argument 'count' must be integer, got string \"3\""),
        ({"code": "x", "count": True}, "argument 'count' must be integer, got boolean true"),
        ({"code": "x", "count": 11}, "argument 'count' must be <= 10, got 11"),
        ({"code": "", "count": 1}, "argument 'code' must have at least 1 characters"),
        (
            {"code": "x", "count": 1, "mode": "slow"},
            'argument \'mode\' must be one of "fast", "exact"; got "slow"',
        ),
        ({"code": "x", "count": 1, "flags": [True, 1]}, "argument 'flags[1]' must be boolean, got integer 1"),
        ({"code": "x", "count": 1, "flags": [True] * 4}, "argument 'flags' must have at most 3 items"),
        ({"code": "x", "count": 1, "note": 5}, "argument 'note' must be string or null, got integer 5"),
        ({"code": "x", "count": 1, "point": {"x": 1}}, "missing required argument 'point.y' (number)"),
        (
            {"code": "x", "count": 1, "point": {"x": 1, "y": 2, "z": 3}},
            "unknown argument 'point.z' (accepted: x, y)",
        ),
    ],
)
def test_each_problem_is_named_precisely(args: dict[str, Any], message: str) -> None:
    assert message in validate_arguments(args, SCHEMA)


def test_integral_floats_count_as_integers_and_ints_as_numbers() -> None:
    assert validate_arguments({"code": "x", "count": 2.0, "ratio": 1}, SCHEMA) == []


def test_every_problem_is_reported_at_once() -> None:
    problems = validate_arguments({"count": "many", "mode": 1}, SCHEMA)
    assert len(problems) == 3


def test_non_objects_and_empty_schemas() -> None:
    assert validate_arguments(["a"], SCHEMA) == ['the arguments must be a JSON object, got array ["a"]']
    assert validate_arguments({"anything": 1}, {}) == []
    assert validate_arguments({"anything": 1}, {"type": "object"}) == []


def test_unknown_keywords_and_remote_refs_never_reject() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "https://example.invalid/s.json", "format": "uuid"}},
    }
    assert validate_arguments({"a": "not-a-uuid"}, schema) == []


def test_signature_summary() -> None:
    assert describe_signature(SCHEMA).startswith("code: string (required), count: integer (required), ratio: number")
    assert "note: string or null" in describe_signature(SCHEMA)
    assert describe_signature({"type": "object", "properties": {}}) == "no arguments"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=5), json_values, max_size=5))
def test_never_raises_on_any_json_object(args: dict[str, Any]) -> None:
    problems = validate_arguments(args, SCHEMA)
    assert isinstance(problems, list) and len(problems) <= 10
