"""Every format's rendering of a call comes back exactly through parse_tool_calls and repair_arguments.

The strings are the ones repair used to cut or change: markdown fences (also inside a fenced block),
``</arguments>`` and ``</use_mcp_tool>``, quotes, backslashes and code. Each finding of the audit is also
pinned below as a plain example.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowllm.parsing import StreamingToolCallParser, parse_tool_calls, repair_arguments

_SETTINGS = settings(
    max_examples=50, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)

_PIECES = ["```", "```bash\n", "```json\n", "\n```\n", "</arguments>", "<arguments>", "</use_mcp_tool>",
           "<use_mcp_tool>", '"', "'", '\\"', "\\", "\\\\", "\\n", "\n", "\t", "{", "}", "[", "]", ",", ":",
           'print("hi")', "def f(x):\n    return {'a': x}\n", "pip install x", "C:\\Users\\a", r"\d+\s*",
           '{"k": "v"}', "# T\n", "é", "😀"]  # fmt: skip
_string = st.lists(st.sampled_from(_PIECES) | st.text(max_size=6), max_size=10).map("".join)
_KEYS = ["code", "content", "query", "path", "html", "a_b"]
_key = st.sampled_from(_KEYS)
_args = st.dictionaries(_key, _string, min_size=1, max_size=4)

TOOL = "write"


def _dumps(args: dict[str, str], indent: bool) -> str:
    return json.dumps(args, ensure_ascii=False, indent=2 if indent else None)


def _mcp(args: dict[str, str], indent: bool) -> str:
    return (
        "I will write it.\n<use_mcp_tool>\n<server_name>tool-files</server_name>\n"
        f"<tool_name>{TOOL}</tool_name>\n<arguments>\n{_dumps(args, indent)}\n</arguments>\n</use_mcp_tool>"
    )


def _mcp_fenced(args: dict[str, str], indent: bool) -> str:
    return (
        f"<use_mcp_tool>\n<server_name>tool-files</server_name>\n<tool_name>{TOOL}</tool_name>\n"
        f"<arguments>\n```json\n{_dumps(args, indent)}\n```\n</arguments>\n</use_mcp_tool>"
    )


def _hermes(args: dict[str, str], indent: bool) -> str:
    return f'<tool_call>\n{{"name": "{TOOL}", "arguments": {_dumps(args, indent)}}}\n</tool_call>'


def _mistral_list(args: dict[str, str], indent: bool) -> str:
    return f'[TOOL_CALLS][{{"name": "{TOOL}", "arguments": {_dumps(args, indent)}}}]'


def _mistral_v11(args: dict[str, str], indent: bool) -> str:
    return f"[TOOL_CALLS]{TOOL}{_dumps(args, indent)}"


def _kimi(args: dict[str, str], indent: bool) -> str:
    return (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions."
        f"{TOOL}:0<|tool_call_argument_begin|>{_dumps(args, indent)}<|tool_call_end|><|tool_calls_section_end|>"
    )


def _deepseek_v3(args: dict[str, str], indent: bool) -> str:
    return (
        f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{TOOL}\n```json\n"
        f"{_dumps(args, indent)}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )


def _deepseek_v31(args: dict[str, str], indent: bool) -> str:
    return f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{TOOL}<｜tool▁sep｜>{_dumps(args, indent)}<｜tool▁call▁end｜>"


def _pythonic(args: dict[str, str], indent: bool) -> str:
    return "[" + TOOL + "(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")]"


def _json(args: dict[str, str], indent: bool) -> str:
    return json.dumps({"name": TOOL, "arguments": args}, ensure_ascii=False, indent=2 if indent else None)


def _json_fenced(args: dict[str, str], indent: bool) -> str:
    return "Calling it:\n```json\n" + _json(args, indent) + "\n```"


RENDERERS: dict[str, Callable[[dict[str, str], bool], str]] = {
    "mcp_xml": _mcp,
    "mcp_xml fenced arguments": _mcp_fenced,
    "hermes": _hermes,
    "mistral list": _mistral_list,
    "mistral v11": _mistral_v11,
    "kimi_k2": _kimi,
    "deepseek_v3": _deepseek_v3,
    "deepseek_v3.1": _deepseek_v31,
    "pythonic": _pythonic,
    "json": _json,
    "json fenced": _json_fenced,
}


def _round_trip(reply: str, args: dict[str, str]) -> None:
    parsed = parse_tool_calls(reply)
    assert not parsed.bad, parsed.bad
    (call,) = parsed.calls
    assert call.name == TOOL
    repaired = repair_arguments(call.arguments_text)
    assert repaired.ok and repaired.value == args, (call.arguments_text, repaired)
    streamed = StreamingToolCallParser()
    for i in range(0, len(reply), 7):
        streamed.feed(reply[i : i + 7])
    assert streamed.finish().to_dict() == parsed.to_dict()


@pytest.mark.parametrize("fmt", list(RENDERERS))
def test_every_text_format_round_trips_any_strings(fmt: str) -> None:
    render = RENDERERS[fmt]

    @_SETTINGS
    @given(_args, st.booleans())
    def check(args: dict[str, str], indent: bool) -> None:
        _round_trip(render(args, indent), args)

    check()


def _xml_value(v: str) -> str:
    return v.strip()  # XML formats put each value on its own lines: surrounding whitespace is layout


# Their values are raw text, not JSON strings: a value cannot hold the markup of the format itself (or the
# opening tag of the text protocol, which is read first), whatever the parser does.
_xml_string = _string.map(_xml_value).filter(
    lambda v: "</parameter>" not in v and "</arg_value>" not in v and "<use_mcp_tool" not in v
)
_xml_args = st.dictionaries(_key, _xml_string, min_size=1, max_size=4)
_STRING_SCHEMA = {TOOL: {"type": "object", "properties": {k: {"type": "string"} for k in _KEYS}}}


@_SETTINGS
@given(_xml_args)
def test_xml_parameter_formats_round_trip_any_strings(args: dict[str, str]) -> None:
    qwen = f"<tool_call>\n<function={TOOL}>\n" + "".join(
        f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items()
    )
    qwen += "</function>\n</tool_call>"
    glm = f"<tool_call>{TOOL}\n" + "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items()
    )
    glm += "</tool_call>"
    for reply in (qwen, glm):
        (call,) = parse_tool_calls(reply, tools=_STRING_SCHEMA).calls
        assert repair_arguments(call.arguments_text).value == args


@_SETTINGS
@given(_args)
def test_native_calls_round_trip_any_strings(args: dict[str, str]) -> None:
    chat = [{"id": "c1", "type": "function", "function": {"name": TOOL, "arguments": json.dumps(args)}}]
    anthropic = [{"type": "tool_use", "id": "t1", "name": TOOL, "input": args}]
    responses = [{"type": "function_call", "call_id": "r1", "name": TOOL, "arguments": json.dumps(args)}]
    for payload in (chat, anthropic, responses):
        (call,) = parse_tool_calls(payload).calls
        assert repair_arguments(call.arguments_text).value == args


# ------------------------------------------------------------------------------- the audit's findings
README = "# T\n```bash\npip install x\n```\n"


def test_a_fence_inside_a_fenced_string_stays_in_the_string() -> None:
    text = "```json\n" + json.dumps({"content": README}) + "\n```"
    r = repair_arguments(text)
    assert r.ok and r.value == {"content": README} and r.stage == "fences"
    reply = _mcp_fenced({"path": "README.md", "content": README}, False)
    (call,) = parse_tool_calls(reply).calls
    assert repair_arguments(call.arguments_text).value == {"path": "README.md", "content": README}


def test_the_closing_arguments_tag_inside_a_string_is_content() -> None:
    args = {"html": "<p>see </arguments> and </use_mcp_tool> here</p>", "code": 'print("</arguments>")'}
    (call,) = parse_tool_calls(_mcp(args, False) + "\nThanks.").calls
    assert repair_arguments(call.arguments_text).value == args
    assert parse_tool_calls(_mcp(args, False) + "\nThanks.").content.endswith("Thanks.")


@pytest.mark.parametrize("text", ['print("hi")', "garbage (( ::", "call(x)", "f(1, 2) then g(3)"])
def test_text_without_json_structure_is_not_repaired(text: str) -> None:
    r = repair_arguments(text)
    assert not r.ok and r.error and r.raw == text


def test_unreadable_arguments_become_a_bad_call_with_the_raw_text() -> None:
    reply = '<use_mcp_tool>\n<tool_name>t</tool_name>\n<arguments>\nprint("hi")\n</arguments>\n</use_mcp_tool>'
    (call,) = parse_tool_calls(reply).calls
    r = repair_arguments(call.arguments_text)
    assert not r.ok and r.raw == 'print("hi")'


def test_a_tuple_at_the_start_is_still_a_value() -> None:
    assert repair_arguments("(1, 2)").value == {"value": [1, 2]}
    assert repair_arguments("  ('a', 'b')").value == {"value": ["a", "b"]}
