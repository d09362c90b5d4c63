"""parse_tool_calls: formats, servers, native payloads, bad calls, determinism."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletionMessageToolCall
from openai.types.responses import ResponseFunctionToolCall

from flowllm.core.types import ModelResponse, NativeToolCall
from flowllm.errors import ConfigError
from flowllm.parsing import (
    FORMATS,
    BadToolCall,
    Parsed,
    StreamingToolCallParser,
    ToolCall,
    parse_tool_calls,
    repair_arguments,
    validate_formats,
)

REPLY = """Let me look at the data first.

<use_mcp_tool>
<server_name>tool-python</server_name>
<tool_name>run_python</tool_name>
<arguments>
{"code": "rows = [r for r in open("data.csv")]
print(len(rows), "rows")"}
</arguments>
</use_mcp_tool>
<Use_MCP_Tool priority="high">
  <server_name> tool-math </server_name>
  <TOOL_NAME>calculate</TOOL_NAME>
  <arguments>{"expression": "6*7"}
</use_mcp_tool>
"""


def test_mcp_xml_prose_two_calls_and_lenient_tags() -> None:
    parsed = parse_tool_calls(REPLY)
    assert [(c.id, c.server, c.name) for c in parsed.calls] == [
        ("call_0", "tool-python", "run_python"),
        ("call_1", "tool-math", "calculate"),
    ]
    code = repair_arguments(parsed.calls[0].arguments_text).value["code"]
    assert code == 'rows = [r for r in open("data.csv")]\nprint(len(rows), "rows")'
    assert repair_arguments(parsed.calls[1].arguments_text).value == {"expression": "6*7"}
    assert parsed.content.strip() == "Let me look at the data first."
    assert parsed.bad == [] and parsed.formats == ["mcp_xml"]


def test_mcp_xml_cut_off_at_the_end_of_the_reply_is_mended() -> None:
    text = '<use_mcp_tool>\n<server_name>s</server_name>\n<tool_name>t</tool_name>\n<arguments>\n{"q": "x'
    (call,) = parse_tool_calls(text).calls
    assert repair_arguments(call.arguments_text).value == {"q": "x"}


def test_malformed_block_is_reported_not_dropped() -> None:
    text = "<use_mcp_tool><server_name>s</server_name><arguments>{}</arguments></use_mcp_tool>"
    parsed = parse_tool_calls(text)
    assert parsed.calls == []
    assert parsed.bad == [BadToolCall("<use_mcp_tool> block without a <tool_name>", text)]


def test_same_text_same_ids() -> None:
    assert parse_tool_calls(REPLY).to_dict() == parse_tool_calls(REPLY).to_dict()


def test_native_server_tool_names_split_after_a_known_server() -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "tool-python-run_python", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "get-weather-now", "arguments": {"city": "x"}}},
    ]
    known = parse_tool_calls(calls, servers=["tool-python", "tool"])
    assert [(c.id, c.server, c.name) for c in known.calls] == [
        ("c1", "tool-python", "run_python"),
        ("c2", None, "get-weather-now"),
    ]
    unknown = parse_tool_calls(calls)
    assert [(c.server, c.name) for c in unknown.calls] == [("tool-python", "run_python"), ("get-weather", "now")]
    assert json.loads(unknown.calls[1].arguments_text) == {"city": "x"}


def test_text_formats_leave_names_whole_unless_a_server_is_known() -> None:
    text = '<tool_call>{"name": "tool-python-run_python", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text).calls[0].server is None
    assert parse_tool_calls(text, servers=["tool-python"]).calls[0].server == "tool-python"


def test_openai_sdk_objects_and_responses_items() -> None:
    chat = ChatCompletionMessageToolCall(
        id="call_a", type="function", function={"name": "search", "arguments": '{"q": "x"}'}
    )
    (c,) = parse_tool_calls([chat]).calls
    assert (c.id, c.name, c.arguments_text) == ("call_a", "search", '{"q": "x"}')
    item = ResponseFunctionToolCall(type="function_call", call_id="fc_1", name="search", arguments='{"q": 1}')
    response = {"output": [{"type": "message", "content": []}, item.model_dump()]}
    for payload in (item, item.model_dump(), [item], response):
        (c,) = parse_tool_calls(payload).calls
        assert (c.id, c.name, c.arguments_text) == ("fc_1", "search", '{"q": 1}')


def test_model_response_native_calls_win_over_text() -> None:
    resp = ModelResponse(text="thinking aloud", stop_reason="tool_use", tool_calls=[NativeToolCall("t1", "f", "{}")])
    parsed = parse_tool_calls(resp)
    assert [c.id for c in parsed.calls] == ["t1"] and parsed.content == "thinking aloud"
    assert parse_tool_calls(ModelResponse(text=REPLY, stop_reason="end_turn")).calls[0].name == "run_python"


def test_formats_restrict_detection() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call> and {"name": "b", "arguments": {}}'
    assert [c.name for c in parse_tool_calls(text).calls] == ["a"]
    assert [c.name for c in parse_tool_calls(text, formats=["hermes"]).calls] == ["a"]
    assert [c.name for c in parse_tool_calls(text, formats=["json"]).calls] == ["a", "b"]  # plain JSON only
    assert parse_tool_calls(text, formats=["mcp_xml"]).calls == []
    with pytest.raises(ConfigError, match=r"^parse_tool_calls\.formats must be one of mcp_xml, .*, not 'xml'"):
        validate_formats(["hermes", "xml"])
    assert {"mcp_xml", "hermes", "json", "pythonic", "mistral", "qwen3_coder", "glm4"} <= set(FORMATS)


def test_text_that_merely_contains_json_is_not_a_call() -> None:
    text = 'The config is {"name": "prod", "replicas": 3} and the result was [1, 2].'
    parsed = parse_tool_calls(text)
    assert parsed.calls == [] and parsed.bad == [] and parsed.content == text


def test_python_in_prose_is_not_a_pythonic_call() -> None:
    text = "Use `[f(x) for x in data]` or [len(a), len(b)] to count."
    assert parse_tool_calls(text).to_dict() == Parsed(content=text).to_dict()


def test_pythonic_bad_sibling_is_reported_and_good_call_kept() -> None:
    parsed = parse_tool_calls("[bad(x=b'z'), get_weather(city='Paris', days=None)]")
    assert [(c.id, c.name) for c in parsed.calls] == [("call_0", "get_weather")]
    assert json.loads(parsed.calls[0].arguments_text) == {"city": "Paris", "days": None}
    assert len(parsed.bad) == 1 and "bytes" in parsed.bad[0].reason


def test_unknown_tool_is_a_bad_call_when_tools_are_given() -> None:
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    parsed = parse_tool_calls(text, tools=[{"server": "s", "name": "ls", "description": "", "input_schema": {}}])
    assert parsed.calls == [] and "unknown tool 'rm_rf'" in parsed.bad[0].reason


def test_xml_parameters_are_typed_by_the_schema() -> None:
    text = (
        "<tool_call>\n<function=f>\n<parameter=zip>\n007\n</parameter>\n"
        "<parameter=n>\n007\n</parameter>\n</function>\n</tool_call>"
    )
    schema = {"f": {"type": "object", "properties": {"zip": {"type": "string"}, "n": {"type": "integer"}}}}
    (call,) = parse_tool_calls(text, tools=schema).calls
    assert json.loads(call.arguments_text) == {"zip": "007", "n": 7}


def test_streaming_yields_each_call_once_when_complete() -> None:
    parser = StreamingToolCallParser()
    seen: list[ToolCall] = []
    for i in range(0, len(REPLY), 5):
        seen += parser.feed(REPLY[i : i + 5])
        if "</use_mcp_tool>" not in parser.text:
            assert seen == []  # nothing before the first block closes
    assert [c.name for c in seen] == ["run_python", "calculate"]
    assert parser.finish().calls == seen


def test_dataclasses_round_trip_through_json() -> None:
    parsed = parse_tool_calls(REPLY + "<use_mcp_tool><arguments></arguments></use_mcp_tool>")
    again = Parsed.from_dict(json.loads(json.dumps(parsed.to_dict())))
    assert again == parsed
    assert ToolCall.from_dict(parsed.calls[0].to_dict()) == parsed.calls[0]
    assert BadToolCall.from_dict(parsed.bad[0].to_dict()) == parsed.bad[0]
