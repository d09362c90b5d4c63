"""Replay verdicts in ``python -m flowllm.inspect``: per task, in the filters, in diff and in the report's data.

The runs are the session's real ones (tests/replay/runs.py): the ``repair=strict`` replay diverges at the
lenient task's ``repair_arguments`` and replays the clean task exactly; the replay of a copy that lost a turn
misses that turn for the lenient task and, run without tools, diverges for the other one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from flowllm.inspect.cli import main
from tests.appfork import run_app
from tests.replay.runs import CLEAN_TASK, LENIENT_TASK, PROJECT_ROOT, FixtureRuns


def inspect(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def inspect_json(capsys: pytest.CaptureFixture[str], *args: str | Path) -> object:
    code, out, err = inspect(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def header(out: str) -> list[str]:
    """The column names of the table printed by ``tasks``."""
    line = next(line for line in out.splitlines() if line.split()[:3] == ["task", "level", "status"])
    return line.split()


def row(out: str, task_id: str) -> str:
    """A task's row and the line after it (where a divergence's place goes); long ids end with an ellipsis."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(task_id[:9]))
    return "\n".join(lines[at : at + 2])


def test_tasks_of_a_replay_have_a_replay_column(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, runs.strict.run_dir, "tasks")
    assert code == 0
    assert "replay" in header(out)
    assert "diverged at" in row(out, LENIENT_TASK) and "turn 1 / repair_arguments" in row(out, LENIENT_TASK)
    assert "exact" in row(out, CLEAN_TASK).splitlines()[0]
    code, out, _ = inspect(capsys, runs.missing_turn.run_dir, "tasks")
    assert "missing" in row(out, LENIENT_TASK).splitlines()[0]
    assert "diverged at" in row(out, CLEAN_TASK)
    rows = inspect_json(capsys, runs.strict.run_dir, "tasks")
    verdicts = {r["task_id"]: r["replay"] for r in rows}  # type: ignore[union-attr,index]
    assert verdicts[CLEAN_TASK] == {"status": "exact"}
    assert (verdicts[LENIENT_TASK]["status"], verdicts[LENIENT_TASK]["turn"]) == ("diverged", 1)


def test_a_run_that_is_not_a_replay_has_no_replay_column(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, runs.original.run_dir, "tasks")
    assert code == 0 and "replay" not in header(out)
    assert "tokens" in header(out) and "cost" in header(out)  # a live run's spend stays where it was
    rows = inspect_json(capsys, runs.original.run_dir, "tasks")
    assert all("replay" not in r for r in rows)  # type: ignore[union-attr]


def test_the_replay_filter(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    def ids(run: Path, *args: str) -> list[str]:
        return [r["task_id"] for r in inspect_json(capsys, run, "tasks", *args)]  # type: ignore[union-attr,index]

    assert ids(runs.strict.run_dir, "--replay", "diverged") == [LENIENT_TASK]
    assert ids(runs.strict.run_dir, "--replay", "exact") == [CLEAN_TASK]
    assert ids(runs.strict.run_dir, "--replay", "missing") == []
    assert ids(runs.missing_turn.run_dir, "--replay", "missing") == [LENIENT_TASK]
    # A diverged task is unscored: neither correct nor wrong.
    assert ids(runs.missing_turn.run_dir, "--replay", "diverged") == [CLEAN_TASK]
    assert ids(runs.missing_turn.run_dir, "--replay", "diverged", "--status", "correct") == []
    assert ids(runs.missing_turn.run_dir, "--replay", "diverged", "--status", "wrong") == []
    assert ids(runs.missing_turn.run_dir, "--replay", "diverged", "--status", "unscored") == [CLEAN_TASK]
    code, out, _ = inspect(capsys, runs.strict.run_dir, "tasks", "--replay", "diverged")
    assert code == 0 and LENIENT_TASK in out and CLEAN_TASK not in out and "(1 of 2)" in out


def test_the_replay_filter_refuses_what_it_cannot_filter(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:  # argparse's refusal, as for --status
        main([str(runs.strict.run_dir), "tasks", "--replay", "stale"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'stale'" in capsys.readouterr().err
    code, _, err = inspect(capsys, runs.original.run_dir, "tasks", "--replay", "exact")
    assert code == 2 and "is not a replay (provider=replay)" in err


def test_task_shows_what_changed_at_the_divergence(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, runs.strict.run_dir, "task", LENIENT_TASK)
    assert code == 0
    assert "diverged at turn 1 / repair_arguments" in out
    assert "repair_arguments output, at prepared_calls[0].arguments" in out
    # The saved run repaired the code; this one could not, and its tool got an error instead.
    saved, new = out.split("saved run:", 1)[1].split("this run:", 1)
    assert 'if row["region"] == "North":' in saved
    assert new.splitlines()[1].strip(" │") == "null"
    flat = " ".join(out.replace("│", " ").split())  # panels wrap long lines
    # Marked once, in turn 1's timeline, on that node.
    assert len(re.findall(r"repair_arguments [\d.]+s \(replay diverged here\)", flat)) == 1
    assert flat.count("replay diverged here") == 1
    assert f"diff {runs.original.run_dir} {runs.strict.run_dir}" in flat
    data = inspect_json(capsys, runs.strict.run_dir, "task", LENIENT_TASK)
    replay = data["replay"]  # type: ignore[index]
    assert (replay["status"], replay["turn"], replay["node"], replay["folder"]) == (
        "diverged",
        1,
        "repair_arguments",
        "06_repair_arguments",
    )
    assert replay["path"] == "prepared_calls[0].arguments"
    assert replay["saved"]["code"].startswith("import csv") and replay["new"] is None
    assert replay["saved_run"] == str(runs.original.run_dir)


def test_task_of_a_diverged_string_starts_near_the_change(
    runs: FixtureRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without tools the system prompt loses its tool section: both sides are shown from near where it differs."""
    replay = inspect_json(capsys, runs.missing_turn.run_dir, "task", CLEAN_TASK)["replay"]  # type: ignore[index]
    assert (replay["node"], replay["path"]) == ("mark_cache", "prompt_system[0].text")
    assert replay["saved"].startswith("...") and "# Tool use" in replay["saved"]
    assert replay["new"].startswith("...") and "# Tool use" not in replay["new"]
    assert replay["saved"][3:] != replay["new"][3:]


def test_task_of_an_exact_and_of_a_missing_replay(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, runs.strict.run_dir, "task", CLEAN_TASK)
    assert code == 0 and "replay diverged here" not in out and "saved run:" not in out
    assert inspect_json(capsys, runs.strict.run_dir, "task", CLEAN_TASK)["replay"]["status"] == "exact"  # type: ignore[index]
    code, out, _ = inspect(capsys, runs.missing_turn.run_dir, "task", LENIENT_TASK)
    assert code == 0 and "asked for a reply the saved run never had" in out
    data = inspect_json(capsys, runs.original.run_dir, "task", LENIENT_TASK)
    assert "replay" not in data  # type: ignore[operator]


def test_summary_names_the_tasks_that_did_not_replay_exactly(
    runs: FixtureRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = inspect(capsys, runs.strict.run_dir)
    assert code == 0
    listed = out.split("tasks that did not replay exactly", 1)[1]
    assert LENIENT_TASK in listed and CLEAN_TASK not in listed
    assert "but 1 task did not replay exactly" in out
    code, out, _ = inspect(capsys, runs.original.run_dir)
    assert "did not replay exactly" not in out


def test_tasks_replay_filter_from_the_command_line(runs: FixtureRuns) -> None:
    done = run_app(
        [str(runs.strict.run_dir), "tasks", "--replay", "diverged"],
        module="flowllm.inspect",
        cwd=PROJECT_ROOT,
        env=dict(os.environ),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert LENIENT_TASK in done.stdout and CLEAN_TASK not in done.stdout
    assert "turn 1 / repair_arguments" in done.stdout


def test_diff_of_two_replays_flags_the_task_whose_verdict_differs(
    runs: FixtureRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    exact, strict = runs.replays["legacy"].run_dir, runs.strict.run_dir
    code, out, _ = inspect(capsys, "diff", exact, strict)
    assert code == 0
    flat = " ".join(out.replace("│", " ").split())
    assert f"{LENIENT_TASK} replay verdict differs" in flat
    assert "replay A exact, B diverged at turn 1 / repair_arguments (differs)" in flat
    assert f"{CLEAN_TASK} replay verdict differs" not in flat
    assert "replay: A 2 exact, 0 diverged, 0 missing; B 1 exact, 1 diverged, 0 missing; verdict differs for 1 task" in (
        flat
    )
    data = inspect_json(capsys, "diff", exact, strict)
    assert data["replay"]["a"]["exact"] == 2 and data["replay"]["b"]["diverged"] == 1  # type: ignore[index]
    assert data["replay"]["verdict_differs"] == [LENIENT_TASK]  # type: ignore[index]
    task = data["tasks"][0]  # type: ignore[index]
    assert task["replay"]["a"] == {"status": "exact"} and task["replay"]["differs"] is True
    assert (task["replay"]["b"]["status"], task["replay"]["b"]["node"]) == ("diverged", "repair_arguments")


def test_diff_lists_a_task_that_diverged_with_the_same_result(
    runs: FixtureRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two replays can agree on every result field while one of them answered from stale replies."""
    data = inspect_json(capsys, "diff", runs.missing_turn.run_dir, runs.missing_turn.run_dir)
    assert {t["task_id"] for t in data["tasks"]} == {LENIENT_TASK, CLEAN_TASK}  # type: ignore[index]
    assert all(t["changes"] == {} and t["replay"]["differs"] is False for t in data["tasks"])  # type: ignore[index]
    assert data["replay"]["verdict_differs"] == []  # type: ignore[index]


def test_diff_against_a_run_that_is_not_a_replay(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, "diff", runs.original.run_dir, runs.strict.run_dir)
    assert code == 0
    flat = " ".join(out.replace("│", " ").split())
    assert "replay A not a replay, B diverged at turn 1 / repair_arguments" in flat
    assert "replay verdict differs" not in flat  # one side has no verdict to differ from
    assert "replay: A not a replay; B 1 exact, 1 diverged, 0 missing" in flat
    assert "accuracy (exact replays) - 100.0% (1/1)" in flat
    # Two runs that are not replays: no replay lines at all.
    code, out, _ = inspect(capsys, "diff", runs.original.run_dir, runs.original.run_dir)
    assert code == 0 and "replay" not in out.split("B:", 1)[1].split("\n", 1)[1]
    data = inspect_json(capsys, "diff", runs.original.run_dir, runs.original.run_dir)
    assert "replay" not in data  # type: ignore[operator]


def test_a_saved_run_that_is_gone_leaves_the_audit_description(
    runs: FixtureRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replayed run moved away: the task still says where and what changed, from its own result.json."""
    run = tmp_path / "moved"
    shutil.copytree(runs.strict.run_dir, run, ignore=shutil.ignore_patterns("workspace", "*.html"))
    config = run / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace(str(runs.original.run_dir), str(tmp_path / "gone")))
    replay = inspect_json(capsys, run, "task", LENIENT_TASK)["replay"]  # type: ignore[index]
    assert (replay["status"], replay["folder"], replay["path"]) == ("diverged", "06_repair_arguments", None)
    assert "cannot be read" in replay["note"]
    code, out, _ = inspect(capsys, run, "task", LENIENT_TASK)
    assert code == 0 and "prepared_calls[0].arguments" in out and "saved run:" not in out
