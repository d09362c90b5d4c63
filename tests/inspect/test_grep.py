"""``inspect RUN grep TEXT``: each match once per turn, at the first node holding it, with its later repeats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowllm.inspect.artifacts import open_run
from flowllm.inspect.cli import main
from flowllm.inspect.views import grep_run
from tests.inspect.minirun import write_run, write_task

QUESTION = "How many apples are in the crate that the farmer left by the barn door?"
REPLY = "I will count the apples with a tool."


def history(*texts: str) -> dict[str, object]:
    return {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]}


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    """Two turns; every node of a turn carries the conversation so far, as a real pipeline's nodes do."""
    root = write_run(tmp_path / "run")
    turn_1 = [
        ("trim_history", history(QUESTION), history(QUESTION)),
        ("mark_cache", history(QUESTION), history(QUESTION)),
        ("call_model", history(QUESTION), {"response": {"text": REPLY}}),
        ("normalize", {"response": {"text": REPLY}}, {"response": {"text": REPLY}}),
    ]
    turn_2 = [
        ("trim_history", history(QUESTION, REPLY), history(QUESTION, REPLY)),
        ("call_model", history(QUESTION, REPLY), {"response": {"text": "There are 12 apples."}}),
    ]
    write_task(root, "apples", [turn_1, turn_2], answer="12", ground_truth="12")
    return root


def test_a_match_is_listed_once_per_turn_with_its_repeats(run: Path) -> None:
    hits = grep_run(open_run(run), "apples are in the crate")
    where = [(h.turn, h.node, h.file, h.path, h.repeats, h.repeated_in) for h in hits]
    assert where == [
        (1, "01_trim_history", "input.json", "messages[0].content", 2, ["02_mark_cache", "03_call_model"]),
        (2, "01_trim_history", "input.json", "messages[0].content", 1, ["02_call_model"]),
    ]


def test_different_texts_in_one_turn_are_separate_hits(run: Path) -> None:
    hits = grep_run(open_run(run), "apples")
    turn_1 = [(h.node, h.path, h.repeats) for h in hits if h.turn == 1]
    # The question (first in trim_history, repeated by two later nodes) and the reply (first in call_model's
    # output, repeated by normalize; normalize's own input and output are one node, counted once).
    assert turn_1 == [("01_trim_history", "messages[0].content", 2), ("03_call_model", "response.text", 1)]
    assert [(h.node, h.file) for h in hits if h.turn is None] == [(None, "result.json")]  # the task id
    turn_2 = {h.snippet: (h.node, h.repeats) for h in hits if h.turn == 2}
    assert turn_2[QUESTION] == ("01_trim_history", 1)
    assert turn_2["There are 12 apples."] == ("02_call_model", 0)


def test_the_limit_counts_listed_matches_and_keeps_their_repeats_whole(run: Path) -> None:
    hits = grep_run(open_run(run), "apples are in the crate", limit=1)
    assert [(h.turn, h.repeats) for h in hits] == [(1, 2)]


def test_grep_command_says_how_many_later_nodes_repeat_a_match(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run), "grep", "crate that the farmer"]) == 0
    out = capsys.readouterr().out
    assert "2 hit(s)" in out and "3 repeats in later nodes folded" in out
    assert "2 later nodes of the turn" in out and "1 later node of the turn" in out
    assert out.count("01_trim_history") == 2  # not once per node file
    assert main([str(run), "grep", "crate that the farmer", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = [(h["turn"], h["node"], h["repeats"]) for h in data]
    assert rows == [(1, "01_trim_history", 2), (2, "01_trim_history", 1)]
    assert data[0]["repeated_in"] == ["02_mark_cache", "03_call_model"]
