"""repair_json / repair_arguments: what a user of the engine notices."""

from __future__ import annotations

import json

import pytest

from flowllm.errors import ConfigError
from flowllm.parsing import PRESETS, STAGES, Repaired, repair_arguments, repair_json, validate_stages


def test_clean_json_takes_the_fast_path() -> None:
    r = repair_json('{"a": [1, 2.5, true, null], "b": "x"}')
    assert r == Repaired(True, {"a": [1, 2.5, True, None], "b": "x"}, "strict", None, r.raw)


def test_big_integers_are_exact() -> None:
    assert repair_json('{"n": 123456789012345678901234567890}').value == {"n": 123456789012345678901234567890}


def test_code_with_raw_newlines_and_unescaped_quotes_survives_exactly() -> None:
    code = 'import json\nd = {"a": 1, "b": None}\nprint(json.dumps(d), "done")\nprint(f"{d[\'a\']}")'
    broken = '{"code": "' + code + '"}'
    r = repair_arguments(broken)
    assert r.ok and r.stage == "lenient"
    assert r.value == {"code": code}  # None stays None inside code, quotes and braces stay as written


def test_html_attributes_and_json_inside_strings_survive() -> None:
    html = '<a href="https://x.org" class="big">link</a>'
    assert repair_json('{"html": "' + html + '", "n": 1}').value == {"html": html, "n": 1}
    inner = '{"k": [1, 2], "s": "v"}'
    assert repair_json('{"note": "the payload ' + inner + ' was sent"}').value == {
        "note": "the payload " + inner + " was sent"
    }


def test_windows_path_keeps_its_backslashes() -> None:
    r = repair_arguments('{"path": "C:\\Users\\me\\data.csv"}')
    assert r.ok and r.value == {"path": "C:\\Users\\me\\data.csv"}


def test_truncated_output_is_closed() -> None:
    r = repair_arguments('{"command": "ls -la ./data && echo \\"done')
    assert r.value == {"command": 'ls -la ./data && echo "done'}
    assert repair_json('{"a": [1, 2, {"b": "c').value == {"a": [1, 2, {"b": "c"}]}


def test_truncated_code_is_not_cut_at_its_last_quote() -> None:
    r = repair_arguments('{"code": "print(\\"hello\\")\\nre.compile(r\'{}\')')
    assert r.value == {"code": "print(\"hello\")\nre.compile(r'{}')"}


def test_python_literals_outside_strings_only() -> None:
    r = repair_arguments("{'flag': True, 'none': None, 'text': 'None of True'}")
    assert r.value == {"flag": True, "none": None, "text": "None of True"}
    assert r.stage == "python"


def test_json5_features_and_missing_commas() -> None:
    text = '{\n  // settings\n  name: \'x\', "tags": ["a" "b",], retries: 3,\n}'
    assert repair_json(text).value == {"name": "x", "tags": ["a", "b"], "retries": 3}


def test_fences_and_prose_are_stripped() -> None:
    r = repair_json('Sure! Here it is:\n```json\n{"a": 1}\n```\nLet me know.')
    assert r.value == {"a": 1} and r.stage == "fences"


def test_doubled_braces_and_double_encoding() -> None:
    assert repair_json('{{"a": 1}}').value == {"a": 1}
    assert repair_arguments(json.dumps(json.dumps({"a": 1}))).value == {"a": 1}
    assert repair_json('{\\"a\\": \\"b\\"}').value == {"a": "b"}


def test_repair_arguments_always_gives_a_dict() -> None:
    assert repair_arguments("").value == {}
    assert repair_arguments("[1, 2]").value == {"value": [1, 2]}
    assert repair_arguments('"hello"').value == {"value": "hello"}
    assert repair_arguments({"already": "dict"}).value == {"already": "dict"}


def test_failure_is_a_result_with_the_raw_text_never_an_exception() -> None:
    r = repair_arguments("I could not decide which tool to call.")
    assert not r.ok and r.value is None
    assert r.raw == "I could not decide which tool to call."
    assert "invalid JSON" in (r.error or "")
    assert not repair_json(None).ok  # type: ignore[arg-type]
    assert not repair_json("[" * 5000).ok or repair_json("[" * 5000).value is not None


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_reads_clean_json_with_the_strict_stage(name: str) -> None:
    r = repair_json('{"x": [1, "two"]}', stages=list(PRESETS[name]))
    assert r.ok and r.stage == "strict"


def test_stage_chains_differ_in_what_they_accept() -> None:
    text = "{'a': 1,}"  # single quotes and a trailing comma
    assert not repair_json(text, stages=["strict"]).ok
    assert not repair_json(text, stages=list(PRESETS["strict"])).ok
    assert repair_json(text, stages=list(PRESETS["json5_only"])).stage == "json5"
    assert repair_json(text, stages=list(PRESETS["full"])).ok


def test_each_result_records_the_stage_that_succeeded() -> None:
    assert repair_json('{"a": "line\nbreak"}').stage == "escapes"
    assert repair_json('{"a": 1').stage == "lenient"


def test_validate_stages_names_the_unknown_and_the_valid() -> None:
    validate_stages(["strict", "lenient"])
    with pytest.raises(
        ConfigError, match=r"^repair\.stages must be one of strict, fences, .*, not 'jsno5' \(did you mean 'json5'\?\)$"
    ):
        validate_stages(["strict", "jsno5"])
    with pytest.raises(ConfigError, match=r"^repair\.stages is empty"):
        validate_stages([])
    assert set(STAGES) >= {"strict", "fences", "escapes", "python", "json5", "lenient"}


def test_unknown_stage_at_call_time_is_a_failed_result() -> None:
    r = repair_json("{bad", stages=["nope"])
    assert not r.ok and "nope" in (r.error or "")


def test_key_marks_a_code_field_value() -> None:
    assert repair_json('"print(1)"', key="code").value == "print(1)"
    assert repair_json('{"a": "x, "b": "y"}').value == {"a": "x", "b": "y"}  # prose: a forgotten quote
    code = 'f(x, "b": 2)'
    assert repair_json('{"code": "' + code + '"}').value == {"code": code}  # code: never cut


def test_repaired_round_trips_through_json() -> None:
    r = repair_json("{'a': (1, 2)}")
    again = Repaired.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again == r
