"""MiniMax-M2, gpt-oss harmony, functionary v3.2 and gemma-4 calls, written the way their chat templates (in
llama.cpp's models/templates/) render an assistant's tool calls; code fences and echoed tool schemas are not
calls."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowllm.parsing import StreamingToolCallParser, parse_tool_calls

_SETTINGS = settings(
    max_examples=120, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
SCHEMA = {"n": {"type": "integer"}, "flag": {"type": "boolean"}}
TOOLS = {"calc": {"type": "object", "properties": {"expression": {"type": "string"}, **SCHEMA}}}

# Argument text the families can carry: no markup of their own inside a value.
_value = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="<>|\"'{}[],:\\`", exclude_categories=("Cs", "Cc")),
    min_size=1,
    max_size=20,
).filter(lambda v: v.strip() == v and v not in ("true", "false", "null", "None") and not _numeric(v))
_args = st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), _value, min_size=1, max_size=4)


def _numeric(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def minimax(name: str, args: dict[str, object]) -> str:
    params = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in args.items())
    return f'<minimax:tool_call>\n<invoke name="{name}">\n{params}</invoke>\n</minimax:tool_call>'


def harmony(name: str, args: dict[str, object]) -> str:
    payload = json.dumps(args, ensure_ascii=False)
    return f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>{payload}<|call|>"


def functionary(name: str, args: dict[str, object]) -> str:
    return f">>>{name}\n{json.dumps(args, ensure_ascii=False)}"


def gemma(name: str, args: dict[str, object]) -> str:
    def value(v: object) -> str:
        if isinstance(v, str):
            return f'<|"|>{v}<|"|>'
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)

    body = ",".join(f"{k}:{value(v)}" for k, v in sorted(args.items()))
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|>"


RENDERERS = {"minimax_m2": minimax, "harmony": harmony, "functionary": functionary, "gemma4": gemma}


def calls(text: str, **kw: object) -> list[tuple[str, dict[str, object]]]:
    parsed = parse_tool_calls(text, **kw)  # type: ignore[arg-type]
    return [(c.name, json.loads(c.arguments_text)) for c in parsed.calls]


@_SETTINGS
@given(st.sampled_from(sorted(RENDERERS)), _args, _args, st.sampled_from(["", "Let me check.\n", "ok "]))
def test_every_family_round_trips_two_calls(fmt: str, first: dict, second: dict, prose: str) -> None:
    render = RENDERERS[fmt]
    sep = "\n" if fmt == "functionary" else ""
    text = prose + render("calc", first) + sep + render("other_tool", second)
    parsed = parse_tool_calls(text)
    assert [(c.name, json.loads(c.arguments_text)) for c in parsed.calls] == [("calc", first), ("other_tool", second)]
    assert parsed.bad == [] and parsed.formats == [fmt]
    assert parsed.content.strip() == prose.strip()
    # Streamed in small pieces, the same calls come out.
    stream = StreamingToolCallParser()
    for i in range(0, len(text), 5):
        stream.feed(text[i : i + 5])
    assert stream.finish().to_dict() == parsed.to_dict()


def test_minimax_values_are_typed_by_the_schema_and_a_cut_block_is_read() -> None:
    text = minimax("calc", {"expression": "007", "n": "7", "flag": "true"})
    assert calls(text, tools=TOOLS) == [("calc", {"expression": "007", "n": 7, "flag": True})]
    cut = '<minimax:tool_call>\n<invoke name="calc">\n<parameter name="expression">1+'
    assert calls(cut) == [("calc", {"expression": "1+"})]
    assert parse_tool_calls("<minimax:tool_call>nothing</minimax:tool_call>").bad


def test_harmony_recipient_after_the_channel_and_without_the_start_token() -> None:
    assert calls('<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"n": 1}<|call|>') == [
        ("calc", {"n": 1})
    ]
    # The generation prompt wrote "<|start|>assistant": the reply begins at the recipient.
    assert calls(' to=functions.calc<|channel|>commentary json<|message|>{"n": 2}') == [("calc", {"n": 2})]
    analysis = "<|channel|>analysis<|message|>I should add.<|end|>"
    parsed = parse_tool_calls(analysis + harmony("calc", {"n": 3}))
    assert parsed.content == analysis and len(parsed.calls) == 1


def test_functionary_all_is_text_and_a_repl_prompt_is_not_a_call() -> None:
    parsed = parse_tool_calls('>>>all\nLet me compute.\n>>>calc\n{"n": 1}')
    assert parsed.content == "Let me compute.\n" and [c.name for c in parsed.calls] == ["calc"]
    repl = "In Python:\n>>> print(1)\n1\n"
    assert parse_tool_calls(repl).calls == [] and parse_tool_calls(repl).content == repl
    assert parse_tool_calls(">>>calc\nnot json").bad


def test_functionary_first_call_without_its_marker() -> None:
    # The generation prompt ends with ">>>", so the reply starts with the bare name: a call to an offered tool.
    bare = 'calc\n{"n": 1}'
    assert calls(bare, tools=TOOLS) == [("calc", {"n": 1})]
    assert calls(bare + '\n>>>calc\n{"n": 2}', tools=TOOLS) == [("calc", {"n": 1}), ("calc", {"n": 2})]
    # Not a tool the request offered, or no tools known: a word before a JSON object is text.
    for text, tools in (('result\n{"n": 1}', TOOLS), (bare, None)):
        parsed = parse_tool_calls(text, tools=tools)
        assert parsed.calls == [] and parsed.bad == [] and parsed.content == text
    # A cut first call is a call whose arguments the repair stage completes, like the marked form's.
    cut = parse_tool_calls('calc\n{"expression": "17.5', tools=TOOLS).calls
    assert [(c.name, c.arguments_text) for c in cut] == [("calc", '{"expression": "17.5')]


@_SETTINGS
@given(first=_args, second=_args)
def test_functionary_lead_then_marked_calls_round_trip(first: dict[str, object], second: dict[str, object]) -> None:
    text = functionary("calc", first)[3:] + "\n" + functionary("calc", second)
    assert calls(text, tools=TOOLS) == [("calc", first), ("calc", second)]


def test_gemma_nested_values_and_a_cut_call() -> None:
    text = '<|tool_call>call:calc{o:{k:<|"|>v, w<|"|>},l:[1,<|"|>a<|"|>],n:5,flag:false}<tool_call|>'
    assert calls(text, tools=TOOLS) == [("calc", {"o": {"k": "v, w"}, "l": [1, "a"], "n": 5, "flag": False})]
    assert calls('<|tool_call>call:calc{expression:<|"|>17.5') == [("calc", {"expression": "17.5"})]
    assert parse_tool_calls("<|tool_call>call:calc{no colon}<tool_call|>").bad


def test_a_call_in_a_code_fence_is_content() -> None:
    code = '```python\nrequest = {"name": "search", "arguments": {"q": "x"}}\nprint([f(a=1)])\n```'
    for text in (code, "Here:\n" + code + "\nDone.", code + '\n```py\n[search(q="y")]\n```'):
        parsed = parse_tool_calls(text)
        assert parsed.calls == [] and parsed.bad == [] and parsed.content == text
    # A ```json fence is how many models wrap a real call.
    assert calls('```json\n{"name": "search", "arguments": {"q": "x"}}\n```') == [("search", {"q": "x"})]
    # A call after the code block is still a call.
    assert calls(code + '\n{"name": "search", "arguments": {"q": "z"}}') == [("search", {"q": "z"})]


def test_an_echoed_tool_schema_is_content() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    for echoed in (
        {"name": "search", "description": "Search the web.", "parameters": schema},
        {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": schema}},
    ):
        for text in ("My tools:\n" + json.dumps(echoed), f"<tool_call>{json.dumps(echoed)}</tool_call>"):
            parsed = parse_tool_calls(text)
            assert parsed.calls == [] and parsed.bad == [] and parsed.content == text, text
    # A real call whose arguments merely contain a "properties" key is still a call.
    assert calls('{"name": "set", "arguments": {"properties": {"a": 1}}}') == [("set", {"properties": {"a": 1}})]
