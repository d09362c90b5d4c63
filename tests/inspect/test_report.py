"""The HTML report as a file: self-contained, complete, and tolerant of damaged runs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from flowllm.inspect.cli import main
from flowllm.inspect.report import REF_KEY, build_report_data
from tests.replay.runs import CLEAN_TASK, LENIENT_TASK, FixtureRuns


def embedded_data(html: str) -> dict:
    match = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', html, re.S)
    assert match, "the data block is missing"
    return json.loads(match.group(1))


def make_multirun(runs: FixtureRuns, root: Path) -> Path:
    """A Hydra-style multirun folder: numbered job folders, each a complete run with its .hydra/."""
    root.mkdir()
    for number, finished in enumerate((runs.original, runs.missing_turn)):
        shutil.copytree(finished.run_dir, root / str(number), ignore=shutil.ignore_patterns("workspace", "*.html"))
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


def test_report_is_one_self_contained_file(
    runs: FixtureRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "out" / "report.html"
    assert main(["report", str(runs.original.run_dir), "-o", str(target)]) == 0
    assert "report written" in capsys.readouterr().out
    html = target.read_text(encoding="utf-8")
    # Nothing is fetched: no external script, stylesheet, image or font.
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", html)
    assert "http://" not in html.split('<script id="report-data"')[0]
    assert "url(" not in html
    data = embedded_data(html)
    assert data["kind"] == "run"
    tasks = {t["task_id"]: t for t in data["runs"][0]["tasks"]}
    assert set(tasks) == {LENIENT_TASK, CLEAN_TASK}
    first = tasks[LENIENT_TASK]["turn_records"][0]
    assert [n["folder"] for n in first["nodes"]][:3] == ["01_trim_history", "02_mark_cache", "03_call_model"]
    assert first["calls"][0]["repair_stage"] == "lenient"
    assert all(n["duration_s"] is not None for n in first["nodes"])


def test_long_strings_are_stored_once(runs: FixtureRuns) -> None:
    data = build_report_data(runs.original.run_dir)
    table = data["strings"]
    assert len(table) == len(set(table))
    system_prompts = [s for s in table if s.startswith("You are a careful assistant")]
    assert len(system_prompts) == 1  # sent in every turn, stored once
    assert any(REF_KEY in json.dumps(t["turn_records"], ensure_ascii=False) for t in data["runs"][0]["tasks"])


def test_very_long_values_are_cut_with_a_note(runs: FixtureRuns) -> None:
    data = build_report_data(runs.original.run_dir, max_chars=100)
    assert any(s.endswith("more characters cut from the report]") for s in data["strings"])


def test_multirun_report_has_the_sweep(runs: FixtureRuns, tmp_path: Path) -> None:
    root = make_multirun(runs, tmp_path / "multirun")
    (root / "2").mkdir()  # a job that crashed before writing anything is skipped, not fatal
    data = build_report_data(root)
    assert data["kind"] == "multirun"
    assert [r["label"] for r in data["runs"]] == ["0", "1"]
    assert data["runs"][1]["summary"]["failed"] == 1
    assert any("provider=replay" in o for o in data["runs"][1]["overrides"])


def test_report_of_a_damaged_run_still_renders(runs: FixtureRuns, tmp_path: Path) -> None:
    run = tmp_path / "damaged"
    shutil.copytree(runs.original.run_dir, run, ignore=shutil.ignore_patterns("workspace"))
    (run / "tasks" / LENIENT_TASK / "turn_001" / "03_call_model" / "output.json").write_text('{"raw_')
    (run / "summary.json").unlink()
    data = build_report_data(run)
    assert any("no summary.json" in p for p in data["runs"][0]["problems"])
    node = data["runs"][0]["tasks"][0]["turn_records"][0]["nodes"][2]
    assert "not valid JSON" in node["output"]["\u00a7error"]


def test_report_of_a_folder_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "is not a flowllm run" in capsys.readouterr().err


def test_a_replay_report_carries_each_task_verdict(runs: FixtureRuns) -> None:
    run = build_report_data(runs.strict.run_dir)["runs"][0]
    assert (run["replay"]["exact"], run["replay"]["diverged"], run["replay"]["missing"]) == (1, 1, 0)
    assert (run["replay"]["accuracy_exact"], run["replay"]["accuracy_scored"]) == (1.0, 1.0)
    # The diverged task is not scored: no figure counts it as correct or wrong.
    assert (run["replay"]["scored"], run["replay"]["unscored"]) == (1, 1)
    tasks = {t["task_id"]: t for t in run["tasks"]}
    assert tasks[CLEAN_TASK]["replay"] == {"status": "exact"} and tasks[CLEAN_TASK]["replay_detail"] is None
    lenient = tasks[LENIENT_TASK]
    assert lenient["replay_label"] == "diverged at turn 1 / repair_arguments"
    detail = lenient["replay_detail"]
    assert (detail["folder"], detail["path"]) == ("06_repair_arguments", "prepared_calls[0].arguments")
    assert detail["new"] is None and detail["saved"]["code"][REF_KEY] is not None  # the code is interned
    # A run that was not a replay carries no verdict at all.
    original = build_report_data(runs.original.run_dir)["runs"][0]
    assert original["replay"] is None and all("replay" not in t for t in original["tasks"])
