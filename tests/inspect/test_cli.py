"""``python -m flowllm.inspect`` on real runs: what a person reads, and the ``--json`` a script reads."""

from __future__ import annotations

import json
import os
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


def test_summary_shows_settings_figures_and_what_failed(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, runs.missing_turn.run_dir)
    assert code == 0
    assert "replay" in out and "graph_parallel" in out
    # One task missed its turn, the other ran without its tools: neither replayed exactly, so no score is given
    # (no "all tasks" figure either: both are unscored).
    assert "unknown: no task was scored (none replayed exactly)" in out
    assert "0 exact, 1 diverged, 1 missing, 0 unverified (2 unscored)" in out and "correct)" not in out
    assert "tasks that failed or answered wrong" in out
    assert LENIENT_TASK in out and "never made this turn" in out


def test_summary_json(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    data = inspect_json(capsys, runs.original.run_dir)
    assert isinstance(data, dict)
    assert data["settings"]["provider"] == "offline" and data["settings"]["repair"] == "full"
    assert data["summary"]["correct"] == 2
    assert data["failures"] == [] and data["problems"] == []


def test_tasks_table_and_filters(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, runs.original.run_dir, "tasks")
    assert code == 0 and LENIENT_TASK in out and CLEAN_TASK in out and "lenient: 1" in out
    rows = inspect_json(capsys, runs.original.run_dir, "tasks", "--level", "2")
    assert [r["task_id"] for r in rows] == [CLEAN_TASK]  # type: ignore[union-attr]
    rows = inspect_json(capsys, runs.missing_turn.run_dir, "tasks", "--status", "failed")
    assert [r["task_id"] for r in rows] == [LENIENT_TASK]  # type: ignore[union-attr]


def test_task_shows_turns_calls_repairs_and_the_answer(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, runs.original.run_dir, "task", LENIENT_TASK)
    assert code == 0
    assert "5259.18" in out  # the answer
    assert "turn 1" in out and "turn 2" in out
    assert "tool-python.run_python" in out and "repair: lenient" in out
    assert 'if row["region"] == "North":' in out  # the repaired code, shown as code, not as a JSON string
    data = inspect_json(capsys, runs.original.run_dir, "task", LENIENT_TASK)
    turns = data["turns"]  # type: ignore[index]
    assert [t["number"] for t in turns] == [1, 2]
    call = turns[0]["calls"][0]
    assert (call["server"], call["name"], call["repair_stage"], call["result"]) == (
        "tool-python",
        "run_python",
        "lenient",
        "5259.18",
    )


def test_task_of_a_failed_replay_names_the_missing_turn(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, runs.missing_turn.run_dir, "task", "sample-01")  # a prefix is enough
    assert code == 0
    assert "failed" in out and "turn 2: the replayed run never made this turn" in out


def test_node_shows_input_and_output_readably(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = inspect(capsys, runs.original.run_dir, "node", LENIENT_TASK, "1", "repair")
    assert code == 0
    assert "06_repair_arguments" in out
    assert "repair_stage: lenient" in out
    assert "total = 0.0" in out  # multi-line code keeps its lines
    data = inspect_json(capsys, runs.original.run_dir, "node", LENIENT_TASK, "turn_001", "03", "--only", "output")
    assert set(data) == {"path", "output"}  # type: ignore[arg-type]
    assert data["output"]["raw_response"]["type"] == "message"  # type: ignore[index]


def test_grep_finds_decoded_text_across_artifacts(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    hits = inspect_json(capsys, runs.original.run_dir, "grep", 'row["region"] == "North"')
    assert hits, "the code with its quotes must be found as written, not as its JSON escape"
    places = {(h["task_id"], h["node"]) for h in hits}  # type: ignore[index]
    assert (LENIENT_TASK, "06_repair_arguments") in places
    assert all(h["task_id"] == LENIENT_TASK for h in hits)  # type: ignore[index]
    # Once per turn: the reply at the node that made it, its copies in the turn's later nodes counted; the
    # repaired code (another value holding the same text) is a hit of its own.
    reply = next(h for h in hits if h["turn"] == 1 and h["node"] == "03_call_model")  # type: ignore[index]
    assert reply["repeats"] == len(reply["repeated_in"]) >= 2 and "04_normalize" in reply["repeated_in"]
    assert len({(h["turn"], h["node"], h["path"]) for h in hits}) == len(hits)  # type: ignore[index]
    assert [h["node"] for h in hits if h["turn"] == 2] == ["01_trim_history"]  # type: ignore[index]
    code, out, _ = inspect(capsys, runs.original.run_dir, "grep", "Operations")
    assert code == 0 and CLEAN_TASK in out


def test_failures_lists_failed_tasks_and_failed_repairs(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    failures = inspect_json(capsys, runs.strict.run_dir, "failures")
    kinds = {(f["kind"], f["task_id"], f["turn"]) for f in failures}  # type: ignore[index]
    assert ("repair_failed", LENIENT_TASK, 1) in kinds
    assert all(f["task_id"] == LENIENT_TASK for f in failures)  # type: ignore[index]
    code, out, _ = inspect(capsys, runs.missing_turn.run_dir, "failures", "--kind", "task_failed")
    assert code == 0 and "task_failed" in out and LENIENT_TASK in out and CLEAN_TASK not in out
    code, out, _ = inspect(capsys, runs.original.run_dir, "failures")
    assert "nothing failed" in out


def test_not_a_run_and_unknown_names(runs: FixtureRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = inspect(capsys, tmp_path)
    assert code == 2 and "is not a flowllm run: expected summary.json and a tasks/ folder" in err
    code, _, err = inspect(capsys, tmp_path / "nowhere")
    assert code == 2 and "does not exist" in err
    code, _, err = inspect(capsys, runs.original.run_dir, "task", "sample-99")
    assert code == 2 and "no task 'sample-99'" in err and LENIENT_TASK in err
    code, _, err = inspect(capsys, runs.original.run_dir, "node", LENIENT_TASK, "7", "call_model")
    assert code == 2 and "has no turn 7 (turns: 1, 2)" in err
    code, _, err = inspect(capsys, runs.original.run_dir, "node", LENIENT_TASK, "1", "nonode")
    assert code == 2 and "no node 'nonode'" in err and "03_call_model" in err


def test_a_multirun_folder_points_to_its_jobs(
    runs: FixtureRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "0").symlink_to(runs.original.run_dir)
    (tmp_path / "1").symlink_to(runs.strict.run_dir)
    code, _, err = inspect(capsys, tmp_path)
    assert code == 2 and "is a multirun folder with 2 runs (0, 1)" in err and "report" in err


@pytest.fixture()
def damaged(runs: FixtureRuns, tmp_path: Path) -> Path:
    """A copy of the original run with a truncated artifact, a lost result and a corrupt summary."""
    run = tmp_path / "damaged"
    shutil.copytree(runs.original.run_dir, run, ignore=shutil.ignore_patterns("workspace"))
    output = run / "tasks" / LENIENT_TASK / "turn_001" / "04_normalize" / "output.json"
    output.write_bytes(output.read_bytes()[:100])
    (run / "tasks" / CLEAN_TASK / "result.json").unlink()
    (run / "summary.json").write_text("{not json")
    return run


def test_damaged_artifacts_are_reported_and_the_rest_is_shown(
    damaged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = inspect(capsys, damaged)
    assert code == 0
    assert "problems reading the run" in out and "summary.json is not valid JSON" in out
    assert "computed from the tasks" in out
    code, out, _ = inspect(capsys, damaged, "tasks")
    assert code == 0 and "unfinished" in out and "5259.18" in out
    code, out, _ = inspect(capsys, damaged, "task", LENIENT_TASK)
    assert code == 0
    assert "04_normalize: output.json is not valid JSON" in out
    assert "repair: lenient" in out  # the turn's other nodes are still read
    failures = inspect_json(capsys, damaged, "failures")
    assert {"task_failed", "unreadable"} <= {f["kind"] for f in failures}  # type: ignore[index]


def test_an_older_layout_is_read(runs: FixtureRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Task folders at the top, unpadded turn folders, bare node names, no meta.json, no config."""
    run = tmp_path / "old"
    task = run / LENIENT_TASK
    shutil.copytree(runs.original.run_dir / "tasks" / LENIENT_TASK, task, ignore=shutil.ignore_patterns("workspace"))
    for turn in task.glob("turn_*"):
        for node in turn.iterdir():
            (node / "meta.json").unlink()
            node.rename(turn / node.name.split("_", 1)[1])
        turn.rename(task / f"turn_{int(turn.name[5:])}")
    code, out, _ = inspect(capsys, run, "task", LENIENT_TASK)
    assert code == 0 and "5259.18" in out and "repair: lenient" in out
    code, out, _ = inspect(capsys, run)
    assert "older layout" in out and "no .hydra/config.yaml" in out


def test_module_entry_point(runs: FixtureRuns) -> None:
    done = run_app(
        [str(runs.original.run_dir), "tasks", "--json"],
        module="flowllm.inspect",
        cwd=PROJECT_ROOT,
        env=dict(os.environ),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert {r["task_id"] for r in json.loads(done.stdout)} == {LENIENT_TASK, CLEAN_TASK}
