"""The GAIA submission file, checked the way GAIA's leaderboard reads one: a JSON object per line with the
mandatory ``task_id`` and ``model_answer`` (``reasoning_trace`` optional), each task of the split once, and the
split's count of tasks per level."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.export.runs import ROWS, RUN_TASKS, SPLIT, flowllm_export


def leaderboard_problems(path: Path, split: list[dict]) -> list[str]:
    """What the leaderboard would refuse in the file (empty: accepted)."""
    gold = {row["task_id"]: row for row in split}
    problems: list[str] = []
    seen: Counter[str] = Counter()
    levels: Counter[int] = Counter()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        try:
            task = json.loads(line)
        except json.JSONDecodeError:
            problems.append(f"line {number} is not JSON")
            continue
        if not isinstance(task.get("task_id"), str) or not isinstance(task.get("model_answer"), str):
            problems.append(f"line {number} lacks task_id or model_answer")
            continue
        if "reasoning_trace" in task and not isinstance(task["reasoning_trace"], str):
            problems.append(f"line {number}: reasoning_trace is not a string")
        if task["task_id"] not in gold:
            problems.append(f"{task['task_id']} is not in the split")
            continue
        seen[task["task_id"]] += 1
        levels[int(gold[task["task_id"]]["Level"])] += 1
    problems += [f"{t} appears {n} times" for t, n in seen.items() if n > 1]
    expected = Counter(int(r["Level"]) for r in split)
    if levels != expected:
        problems.append(f"questions per level {dict(levels)}, the split has {dict(expected)}")
    return problems


def test_every_task_of_the_split_is_in_the_file_and_unanswered_ones_are_named(saved_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "submission.jsonl"
    done = flowllm_export(saved_run, "--format", "gaia-submission", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert leaderboard_problems(target, ROWS) == []
    lines = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    assert [line["task_id"] for line in lines] == list(SPLIT)
    answers = {line["task_id"]: line["model_answer"] for line in lines}
    for task_id in RUN_TASKS:
        result = json.loads((saved_run / "tasks" / task_id / "result.json").read_text(encoding="utf-8"))
        assert answers[task_id] == result["answer"]
    assert answers["not-run"] == ""
    assert "1 task(s) have no answer" in done.stdout and "not-run" in done.stdout
    trace = next(line["reasoning_trace"] for line in lines if line["task_id"] == "wrong")
    assert "[tool tool-python.run_python] 42" in trace and "boxed{41}" in trace


def test_a_checker_that_would_refuse_a_broken_file_refuses_it(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"task_id": "delegate", "model_answer": "385"}\n{"task_id": "wrong"}\n', encoding="utf-8")
    problems = leaderboard_problems(broken, ROWS)
    assert "line 1 lacks task_id or model_answer" in problems
    assert any("questions per level" in p for p in problems)
