"""Final-answer extraction and GAIA's scoring rules, including the dataset loader's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowllm.agent.answer import extract_answer, last_boxed
from flowllm.datasets.gaia import load_tasks, question_scorer
from flowllm.datasets.task import DatasetError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is \\boxed{42}.", "42"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("nested \\boxed{\\frac{1}{2}} ok", "\\frac{1}{2}"),
        ("a set \\boxed{{a, b}}", "{a, b}"),
        ("truncated \\boxed{7} and \\boxed{8", "7"),
        ("no box here", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_extract_answer_falls_back_to_the_text() -> None:
    assert extract_answer("  Paris  ") == "Paris"
    assert extract_answer("so \\boxed{ Paris }") == "Paris"


@pytest.mark.parametrize(
    ("answer", "truth", "ok"),
    [
        ("$1,234.50", "1234.5", True),  # numbers: $, % and , dropped, compared as floats
        ("45%", "45", True),
        ("125.0", "125", True),
        ("124.9", "125", False),
        ("abc", "125", False),
        ("anchor, compass", "anchor, compass", True),  # lists, element-wise
        ("anchor;compass", "anchor, compass", True),
        ("compass, anchor", "anchor, compass", False),
        ("anchor", "anchor, compass", False),
        ("1, 2.0", "1, 2", True),
        ("St. Petersburg", "Saint Petersburg", False),
        ("  the  OPERATIONS! ", "the operations", True),  # strings: case, spaces, punctuation ignored
        (None, "x", False),
        # numbers: the ground truth decides the rule; units and words around the number are not stripped
        ("1,000,000", "1000000", True),
        ("$17", "17", True),
        ("17 dollars", "17", False),
        ("0.50", ".5", True),
        ("-3", "-3.0", True),
        ("3e2", "300", True),
        ("", "0", False),
        # lists: ',' and ';' both separate; same length; numbers by value, strings without spaces, case-blind
        ("1;2;3", "1, 2, 3", True),
        ("$1, 2%, 3", "1, 2, 3", True),
        ("1, 2", "1, 2, 3", False),
        ("1, 2, 3, 4", "1, 2, 3", False),
        ("New York, SAN Francisco", "new york, san francisco", True),
        ("a, b.", "a, b", False),  # inside a list punctuation counts (GAIA keeps it)
        ("apple, 3", "apple, 3.0", True),
        ("apple, three", "apple, 3", False),
        # strings: case, whitespace and punctuation are ignored, nothing else
        ("Saint-Petersburg!", "saint petersburg", True),
        ("The Beatles", "Beatles", False),
        ("", "", True),
        ("x", None, False),
    ],
)
def test_question_scorer(answer: str | None, truth: str | None, ok: bool) -> None:
    assert question_scorer(answer, truth) is ok


def _write(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_loader_selects_by_id_level_and_limit(tmp_path: Path) -> None:
    rows = [
        json.dumps({"task_id": f"t{i}", "Question": "q", "Level": 1 + i % 2, "Final answer": "a", "file_name": ""})
        for i in range(6)
    ]
    folder = _write(tmp_path / "d", rows)
    assert [t.task_id for t in load_tasks(folder, levels=[2])] == ["t1", "t3", "t5"]
    assert [t.task_id for t in load_tasks(folder, limit=2)] == ["t0", "t1"]
    assert [t.task_id for t in load_tasks(folder, task_ids=["t4", "t2"])] == ["t2", "t4"]
    with pytest.raises(DatasetError, match=r"not in .*: nope"):
        load_tasks(folder, task_ids=["nope"])


def test_loader_errors_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_tasks(tmp_path / "missing")
    folder = _write(tmp_path / "bad", ['{"task_id": "a", "Question": "q"}', "{not json"])
    with pytest.raises(DatasetError, match=r"metadata.jsonl:2: not valid JSON"):
        load_tasks(folder)
    folder = _write(tmp_path / "nofield", ['{"task_id": "a"}'])
    with pytest.raises(DatasetError, match=r"metadata.jsonl:1: missing field 'Question'"):
        load_tasks(folder)


def test_bundled_sample_is_valid() -> None:
    tasks = load_tasks(Path(__file__).resolve().parents[1] / "flowllm" / "data" / "sample")
    assert len(tasks) >= 8
    for task in tasks:
        assert task.ground_truth
        if task.attachment is not None:
            assert task.attachment.is_file(), task.file_name
