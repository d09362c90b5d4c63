"""Whole experiments in this process: the gaia bundle on the GAIA-format fixture through the real emulator and
tool servers, pass@k, and resuming from what a run directory holds."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from omegaconf import DictConfig

from flowllm.app import run
from flowllm.engine.recorder import read_json
from tests.experiment.helpers import (
    CSV_TASK,
    LIST_TASK,
    MATH_TASK,
    MISSING_FILE_TASK,
    WRONG_TASK,
    gaia_overrides,
)

Compose = Callable[[Sequence[str]], DictConfig]


def test_gaia_experiment_on_the_fixture(composed: Compose, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERPER_API_KEY", raising=False)  # the web search server is optional: disabled, run goes on
    # Only the servers the fixture's replies use: each server is a process per task.
    cfg = composed(gaia_overrides("~tools.servers.tool-files", "~tools.servers.tool-math"))
    assert cfg.experiment.name == "gaia" and cfg.agent.max_turns == 20
    assert "\\boxed{}" in cfg.agent.system_prompt
    summary = run(cfg, tmp_path)

    assert summary["tasks"] == 5 and summary["completed"] == 4 and summary["failed"] == 1
    assert summary["correct"] == 3 and summary["accuracy"] == 0.6
    assert summary["by_level"]["1"]["accuracy"] == 1.0
    assert summary["by_level"]["2"] == {"tasks": 2, "scored": 2, "unscored": 0, "correct": 1, "accuracy": 0.5}
    assert summary["by_level"]["3"]["correct"] == 0
    assert summary["tool_calls_made"] == summary["tool_calls_parsed"] == 2
    assert summary["cost_usd"] > 0 and summary["cost"]["model"] == "flowllm-emulator"
    assert summary["experiment"] == "gaia" and summary["status"] == "finished"
    assert read_json(tmp_path / "summary.json")["accuracy"] == 0.6

    tasks = tmp_path / "tasks"
    # The attachment was copied into the task's folder, and the tool read it there.
    assert (tasks / CSV_TASK / "workspace" / f"{CSV_TASK}.csv").is_file()
    csv_result = read_json(tasks / CSV_TASK / "result.json")
    assert csv_result["answer"] == "3" and csv_result["correct"] is True
    first_call = read_json(tasks / CSV_TASK / "turn_001" / "03_call_model" / "input.json")
    assert "Attached file (CSV table)" in str(first_call)
    # The number rule: "150.0" scores against "150"; the list rule: "Blue; Red; Yellow" against "blue, red, yellow".
    assert read_json(tasks / MATH_TASK / "result.json")["correct"] is True
    assert read_json(tasks / LIST_TASK / "result.json")["correct"] is True
    wrong = read_json(tasks / WRONG_TASK / "result.json")
    assert wrong["status"] == "completed" and wrong["answer"] == "Paris" and wrong["correct"] is False
    assert not (tasks / WRONG_TASK / "workspace").exists()  # no attachment, no tool worked there: none kept
    # A missing attachment fails that task only, with the reason.
    missing = read_json(tasks / MISSING_FILE_TASK / "result.json")
    assert missing["status"] == "failed"
    assert f"attachment '{MISSING_FILE_TASK}.txt' is missing" in missing["error"]


def test_pass_at_k_stops_at_the_first_correct_attempt(composed: Compose, tmp_path: Path) -> None:
    ids = f"dataset.task_ids=[{LIST_TASK},{WRONG_TASK}]"
    cfg = composed(gaia_overrides("tools=none", "experiment.attempts=3", ids))
    summary = run(cfg, tmp_path)
    solved = read_json(tmp_path / "tasks" / LIST_TASK / "result.json")
    assert solved["correct"] is True and solved["attempts"] == 1 and solved["attempt_log"] == []
    assert not (tmp_path / "tasks" / LIST_TASK / "attempts").exists()

    unsolved = read_json(tmp_path / "tasks" / WRONG_TASK / "result.json")
    assert unsolved["correct"] is False and unsolved["attempts"] == 3
    assert [a["attempt"] for a in unsolved["attempt_log"]] == [1, 2, 3]
    assert all(a["answer"] == "Paris" for a in unsolved["attempt_log"])
    # Usage is the sum over the attempts: every attempt was paid for.
    one = unsolved["attempt_log"][0]["usage"]["input_tokens"]
    assert unsolved["usage"]["input_tokens"] == 3 * one > 0
    # Earlier attempts' records are kept aside; the task folder holds the last attempt.
    task_dir = tmp_path / "tasks" / WRONG_TASK
    for n in (1, 2):
        assert (task_dir / "attempts" / str(n) / "turn_001" / "03_call_model" / "output.json").is_file()
    assert (task_dir / "turn_001" / "03_call_model" / "output.json").is_file()
    assert summary["attempts"] == 3 and summary["attempts_used"] == 4


def _mtimes(run_dir: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (run_dir / "tasks").glob("*/result.json")}


def test_resume_skips_completed_and_reruns_the_rest(composed: Compose, tmp_path: Path) -> None:
    overrides = gaia_overrides("tools=none", f"dataset.task_ids=[{LIST_TASK},{WRONG_TASK},{MISSING_FILE_TASK}]")
    first = run(composed(overrides), tmp_path)
    assert (first["completed"], first["failed"], first["resumed"]) == (2, 1, 0)
    before = _mtimes(tmp_path)

    # Simulate a run that died in the middle of WRONG_TASK: no result, a half-written turn left behind.
    wrong_dir = tmp_path / "tasks" / WRONG_TASK
    (wrong_dir / "result.json").unlink()
    (wrong_dir / "turn_007" / "03_call_model").mkdir(parents=True)
    (wrong_dir / ".result.json.123.456.tmp").write_text("{")

    second = run(composed(overrides), tmp_path)
    after = _mtimes(tmp_path)
    assert second["resumed"] == 1  # LIST_TASK, completed before
    assert after[LIST_TASK] == before[LIST_TASK]  # not run again
    assert after[MISSING_FILE_TASK] != before[MISSING_FILE_TASK]  # failed tasks are retried
    assert read_json(wrong_dir / "result.json")["status"] == "completed"
    assert sorted(p.name for p in wrong_dir.glob("turn_*")) == ["turn_001"]  # the stale turn is gone
    assert not list(wrong_dir.glob(".*.tmp"))
    assert (second["tasks"], second["completed"], second["failed"]) == (3, 2, 1)
    assert second["correct"] == first["correct"] == 1

    # experiment.resume=false runs everything again.
    third = run(composed([*overrides, "experiment.resume=false"]), tmp_path)
    assert third["resumed"] == 0
    assert _mtimes(tmp_path)[LIST_TASK] != after[LIST_TASK]


def test_config_errors_are_caught_before_any_task(composed: Compose, tmp_path: Path) -> None:
    from flowllm.engine.errors import FlowError

    with pytest.raises(FlowError, match=r"experiment.attempts must be at least 1"):
        run(composed(gaia_overrides("experiment.attempts=0")), tmp_path)
    with pytest.raises(FlowError, match=r"price table .* does not exist"):
        run(composed(gaia_overrides(f"experiment.pricing={tmp_path / 'none.yaml'}")), tmp_path)
    with pytest.raises(FlowError, match=r"dataset.format must be one of"):
        run(composed(gaia_overrides("dataset.format=csv")), tmp_path)
    assert not (tmp_path / "tasks").exists()


def test_dataset_path_follows_the_environment(composed: Compose, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWLLM_GAIA_DIR", os.fspath(Path("somewhere") / "gaia"))
    assert composed(["+experiment=gaia"]).dataset.path == os.fspath(Path("somewhere") / "gaia")
    monkeypatch.delenv("FLOWLLM_GAIA_DIR")
    assert composed(["+experiment=gaia"]).dataset.path == "data/gaia/2023/validation"
