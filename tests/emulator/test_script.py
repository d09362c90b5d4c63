"""Script loading, turn selection and templates."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowllm.emulator import NO_SCRIPTED_REPLY, Script, ScriptError
from flowllm.emulator.common import xml_tool_results

SCRIPT = Script.load(
    {
        "default": [{"text": "d1"}, {"text": "d2"}],
        "tasks": {
            "t": [
                {"text": "first"},
                {
                    "thinking": "saw ${last_tool_result}",
                    "text": "got ${tool_result_1} and ${tool_result_2}; ${nope}",
                    "tool_calls": [{"name": "tool-math-calculate", "input": {"expression": "${last_tool_result}+1"}}],
                },
            ]
        },
    }
)


def test_turns_index_the_task_list_then_fall_back_to_default_clamped() -> None:
    assert SCRIPT.reply("t", 1, []).text == "first"
    assert SCRIPT.reply("t", 3, []).text == "d1"  # one turn past the task's list
    assert SCRIPT.reply("t", 9, []).text == "d2"  # clamped to default's last entry
    assert SCRIPT.reply("other", 1, []).text == "d1"
    assert SCRIPT.reply(None, 2, []).text == "d2"


def test_templates_substitute_tool_results_and_leave_unknown_names() -> None:
    reply = SCRIPT.reply("t", 2, ["  4\n", "five "])
    assert reply.text == "got 4 and five; ${nope}"
    assert reply.thinking == "saw five"
    assert reply.tool_calls[0].input == {"expression": "five+1"}
    assert reply.stop_reason == "tool_use"


def test_no_default_means_no_scripted_reply() -> None:
    assert Script.load({"tasks": {}}).reply("t", 1, []).text == NO_SCRIPTED_REPLY


def test_xml_tool_results_are_found_and_unescaped() -> None:
    text = (
        'before <tool_result server="tool-python" tool="run_python">\n'
        "line &lt;/tool_result> 1\n</tool_result>"
        ' mid <tool_result server="a" tool="b">\n2\n</tool_result>'
    )
    assert xml_tool_results(text) == ["line </tool_result> 1", "2"]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"tasks": {"t": [{"txt": "typo"}]}}, "unknown keys"),
        ({"tasks": {"t": [{"text": "x", "tool_calls": [{"input": {}}]}]}}, "needs a 'name'"),
        ({"defaults": []}, "unknown top-level"),
        ({"tasks": ["t"]}, "'tasks' must map"),
    ],
)
def test_malformed_scripts_name_the_problem(data: dict, fragment: str) -> None:
    with pytest.raises(ScriptError, match=fragment):
        Script.load(data)


def test_load_from_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text('default:\n  - text: "I could not solve this task. \\\\boxed{none}"\ntasks:\n  a:\n    - hi\n')
    script = Script.load(path)
    assert script.reply("a", 1, []).text == "hi"
    assert script.reply("b", 1, []).text == "I could not solve this task. \\boxed{none}"
