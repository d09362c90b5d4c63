"""flowllm.analysis: runs and sweep folders as pandas dataframes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flowllm.engine.recorder import read_json
from flowllm.export.source import ExportError
from tests.manual import page

pd = pytest.importorskip("pandas", reason='pandas is not installed (pip install "flowllm[analysis]")')

from flowllm import analysis  # noqa: E402


def test_a_sweep_folder_loads_as_four_frames(saved_run: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "multirun" / "2026-12-04" / "10-00-00"
    for job in ("0", "1", "10", "2"):
        shutil.copytree(saved_run, sweep / job, ignore=shutil.ignore_patterns("workspace"))
    frames = analysis.load(sweep.parent.parent)
    assert [Path(r).name for r in frames.runs["run"]] == ["0", "1", "2", "10"]
    summary = read_json(saved_run / "summary.json")
    assert set(frames.runs["accuracy"]) == {summary["accuracy"]}
    assert "settings.agent.max_turns" in frames.runs and frames.runs["settings.agent.max_turns"].notna().all()
    assert len(frames.tasks) == 4 * summary["tasks"]
    assert frames.tasks.groupby("run")["correct"].mean().tolist() == [summary["accuracy"]] * 4
    assert len(frames.calls) == 4 * len((saved_run / "usage.jsonl").read_text(encoding="utf-8").splitlines())


def test_the_tasks_frame_matches_each_result(saved_run: Path) -> None:
    frames = analysis.load(saved_run)
    tasks = frames.tasks.set_index("task_id")
    for task_id in ("delegate", "wrong"):
        result = read_json(saved_run / "tasks" / task_id / "result.json")
        row = tasks.loc[task_id]
        assert (row["answer"], row["truth"], bool(row["correct"])) == (
            result["answer"],
            result["ground_truth"],
            result["correct"],
        )
        assert row["epoch"] == 1 and row["turns"] == result["turns"]
        assert row["input_tokens"] == result["usage"]["input_tokens"]
        assert row["wall_seconds"] == read_json(saved_run / "tasks" / task_id / "timing.json")["wall_seconds"]
    attempts = frames.calls[frames.calls["type"] == "attempt"]
    billed = attempts.groupby("task_id")["cost_usd"].sum()
    assert tasks.loc["delegate", "cost_usd"] == pytest.approx(billed["delegate"])
    assert str(frames.tasks["correct"].dtype) == "boolean"


def test_the_turns_frame_has_every_node_of_every_conversation(saved_run: Path) -> None:
    turns = analysis.load(saved_run).turns
    on_disk = len(list((saved_run / "tasks").glob("**/turn_*/*/meta.json")))
    assert len(turns) == on_disk
    sub = turns[turns["agent"] == "analyst"]
    assert set(sub["scope"]) == {"turn_001/subagents/analyst-call_0"} and set(sub["turn"]) == {1, 2}
    assert (turns["status"] == "ok").all() and turns["duration_s"].notna().all()


def test_an_unscored_task_is_na_not_false(saved_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(saved_run, run, ignore=shutil.ignore_patterns("workspace"))
    path = run / "tasks" / "wrong" / "result.json"
    result = read_json(path)
    path.write_text(json.dumps({**result, "correct": None}), encoding="utf-8")
    tasks = analysis.load(run).tasks.set_index("task_id")
    assert tasks.loc["wrong", "correct"] is pd.NA
    assert tasks["correct"].mean() == 1.0  # over the scored task only


def test_a_folder_without_runs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="no flowllm run"):
        analysis.load(tmp_path)


def _manual_analysis_example() -> str:
    """The exports guide's ``flowllm.analysis`` example (docs/guides/exports.md), as written there."""
    after = page("guides/exports.md").split("`flowllm.analysis` loads runs", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_manual_analysis_example_runs_on_a_sweep(saved_run: Path, tmp_path: Path) -> None:
    example = _manual_analysis_example()
    written = '"runs/multirun/2026-12-04/10-00-00"'
    assert written in example
    sweep = tmp_path / "multirun" / "2026-12-04" / "10-00-00"
    for job in ("0", "1"):
        shutil.copytree(saved_run, sweep / job, ignore=shutil.ignore_patterns("workspace"))
    namespace: dict[str, object] = {}
    exec(compile(example.replace(written, repr(str(sweep))), "docs/guides/exports.md", "exec"), namespace)
    frames = namespace["frames"]
    assert isinstance(frames, analysis.Frames)
    summary = read_json(saved_run / "summary.json")
    by_model = frames.tasks.groupby("model")["correct"].mean()
    assert by_model.to_dict() == {summary["model"]: summary["accuracy"]}
    assert frames.runs["stats.accuracy.mean"].tolist() == [summary["stats"]["accuracy"]["mean"]] * 2
    assert frames.runs["stats.scored"].tolist() == [summary["stats"]["scored"]] * 2
