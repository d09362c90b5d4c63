"""``python -m flowllm.inspect diff``: which tasks changed, how, and where the two runs first part."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flowllm.inspect import open_run
from flowllm.inspect.cli import main
from flowllm.inspect.diff import diff_runs
from flowllm.rundir.jsondiff import VOLATILE_KEYS, first_difference
from tests.replay.runs import CLEAN_TASK, LENIENT_TASK, FixtureRuns


def test_a_strict_replay_differs_in_the_repaired_task_only(runs: FixtureRuns) -> None:
    result = diff_runs(open_run(runs.original.run_dir), open_run(runs.strict.run_dir))
    assert [t.task_id for t in result.tasks] == [LENIENT_TASK]
    assert result.unchanged == [CLEAN_TASK]
    task = result.tasks[0]
    assert task.changes["repairs"] == ({"lenient": 1}, {"failed": 1})
    assert task.changes["failed_tool_calls"] == (0, 1)
    # The served reply still carries the old answer, but it answered another conversation: unscored.
    assert task.changes["correct"] == (True, None)
    assert task.call_changes and "repair: lenient, ok" in task.call_changes[0]
    assert "repair: failed" in task.call_changes[0]
    # Everything before repair_arguments is the same; its output is where the runs part.
    assert task.divergence is not None
    assert (task.divergence.turn, task.divergence.node, task.divergence.file) == (
        1,
        "06_repair_arguments",
        "output.json",
    )
    assert "prepared_calls[0].arguments" in task.divergence.detail
    assert result.settings_changes["repair.name"] == ("full", "strict")


def test_a_run_against_its_exact_replay_has_no_difference(runs: FixtureRuns) -> None:
    result = diff_runs(open_run(runs.original.run_dir), open_run(runs.replays["legacy"].run_dir))
    assert result.tasks == []
    assert sorted(result.unchanged) == sorted([LENIENT_TASK, CLEAN_TASK])


def test_a_missing_turn_is_the_divergence(runs: FixtureRuns) -> None:
    result = diff_runs(open_run(runs.original.run_dir), open_run(runs.missing_turn.run_dir))
    by_id = {t.task_id: t for t in result.tasks}
    failed = by_id[LENIENT_TASK]
    assert failed.changes["status"] == ("completed", "failed")
    assert failed.changes["correct"] == (True, None)  # the replay has no answer for it: unscored


def test_a_task_the_budget_stopped_is_unfinished_not_wrong(runs: FixtureRuns, tmp_path: Path) -> None:
    """``correct`` reads as the tallies count it: a budget-stopped task says ``correct: false`` in its file, but
    it is unfinished (it once showed ``yes -> no``), and one whose answer could not be scored is unscored. The
    budget that stopped it is among the settings that differ."""
    stopped = tmp_path / "stopped"
    shutil.copytree(runs.original.run_dir, stopped, ignore=shutil.ignore_patterns("workspace", "report.html"))
    for task, edit in ((LENIENT_TASK, {"status": "budget"}), (CLEAN_TASK, {"score_error": "the judge failed"})):
        path = stopped / "tasks" / task / "result.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **edit, "correct": False}))
    config = stopped / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace("  budget:\n    cost_usd: null", "  budget:\n    cost_usd: 0.01", 1))
    result = diff_runs(open_run(runs.original.run_dir), open_run(stopped))
    by_id = {t.task_id: t for t in result.tasks}
    assert by_id[LENIENT_TASK].changes["correct"] == (True, "unfinished")
    assert by_id[CLEAN_TASK].changes["correct"] == (True, "unscored")
    assert result.settings_changes["experiment.budget.cost_usd"] == (None, 0.01)


def test_diff_command_text_and_json(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs.original.run_dir), str(runs.strict.run_dir)]) == 0
    out = capsys.readouterr().out
    assert LENIENT_TASK in out and "first divergence" in out and "06_repair_arguments" in out
    assert "1 task(s) differ, 1 unchanged" in out
    assert main(["diff", str(runs.original.run_dir), str(runs.strict.run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [t["task_id"] for t in data["tasks"]] == [LENIENT_TASK]
    assert data["tasks"][0]["changes"]["failed_tool_calls"] == {"a": 0, "b": 1}
    assert data["tasks"][0]["divergence"].startswith("turn 1 / 06_repair_arguments / output.json")


def test_diff_of_a_folder_that_is_not_a_run(runs: FixtureRuns, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs.original.run_dir), str(tmp_path)]) == 2
    assert "is not a flowllm run" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ({"a": [1, 2]}, {"a": [1, 3]}, "a[1]: 2 vs 3"),
        ({"a": 1}, {"a": 1, "b": 2}, "b: only in the second (2)"),
        ({"x": [1, 2]}, {"x": [1]}, "x[1]: only in the first (2)"),
        ({"v": 1}, {"v": True}, "v: 1 vs true"),
        ({"t": "same start, then A"}, {"t": "same start, then B"}, "t: at character 17:"),
    ],
)
def test_first_difference_paths(left: object, right: object, expected: str) -> None:
    found = first_difference(left, right)
    assert found is not None and found.describe().startswith(expected)


def test_volatile_ids_are_ignored() -> None:
    left = {"raw_response": {"id": "msg_1", "content": [{"type": "tool_use", "id": "toolu_a", "input": {}}]}}
    right = {"raw_response": {"id": "msg_2", "content": [{"type": "tool_use", "id": "toolu_b", "input": {}}]}}
    assert first_difference(left, right, VOLATILE_KEYS) is None
    assert first_difference(left, right) is not None
