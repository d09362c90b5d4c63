"""summary.json -> acted and the console's "what acted" row: trimming, compaction, memory recall and tool-server
restarts, read from what the run writes (node records, the run's log), through the real command line."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from flowllm.run.report import acted_row, tool_server_restarts, what_acted
from flowllm.rundir.layout import LOG_FILE as RUN_LOG
from flowllm.tools import open_tool_pool
from tests.experiment.helpers import run_flowllm
from tests.tools.helpers import flaky_config

TASKS = "dataset.task_ids=[sample-04-temperature-range]"


def summary_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Three runs of a three-turn sample task: plain; a small token budget (and memory written); then compaction with
    the memories of the run before recalled."""
    base = tmp_path_factory.mktemp("acted")
    memory = f"memory.path={base / 'memory.sqlite'}"
    settings = {
        "plain": [],
        "trimmed": ["agent.max_context_tokens=900", "memory.enabled=true", memory],
        "compacted": [
            "memory.enabled=true",
            memory,
            "agent.compaction.enabled=true",
            "agent.compaction.threshold_tokens=300",
            "agent.compaction.keep_turns=1",
        ],
    }
    done: dict[str, tuple[Path, str]] = {}
    for name, extra in settings.items():  # in order: the last run recalls what the one before remembered
        run_dir = base / name
        proc = run_flowllm("progress=false", f"hydra.run.dir={run_dir}", TASKS, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        done[name] = (run_dir, proc.stdout)
    return done


def test_a_plain_run_says_nothing_of_that_kind_acted(runs: dict[str, tuple[Path, str]]) -> None:
    run_dir, stdout = runs["plain"]
    acted = summary_of(run_dir)["acted"]
    assert (acted["trimmed_turns"], acted["dropped_turns"], acted["compactions"], acted["memories_recalled"]) == (
        0,
        0,
        0,
        0,
    )
    assert acted["tool_server_restarts"] == {}
    assert "nothing (no retries" in stdout


def test_a_token_budget_that_trims_is_reported(runs: dict[str, tuple[Path, str]]) -> None:
    run_dir, stdout = runs["trimmed"]
    acted = summary_of(run_dir)["acted"]
    assert acted["trimmed_turns"] > 0 and acted["dropped_turns"] > 0
    assert acted["compactions"] == 0 and acted["memories_recalled"] == 0  # the first run with memory recalls none
    assert "trimmed" in acted_row(acted) and "trimmed" in stdout


def test_compaction_and_recalled_memories_are_reported(runs: dict[str, tuple[Path, str]]) -> None:
    run_dir, stdout = runs["compacted"]
    acted = summary_of(run_dir)["acted"]
    assert acted["compactions"] > 0 and acted["memories_recalled"] > 0
    assert acted["other_agent_calls"].get("compactor", 0) == acted["compactions"]
    row = acted_row(acted)
    assert "compaction" in row and "recalled" in row and "compaction" in stdout


def test_counts_from_partial_node_records_are_not_given(runs: dict[str, tuple[Path, str]]) -> None:
    run_dir, _ = runs["trimmed"]
    acted = what_acted({}, [], run_dir=run_dir, snapshot="errors")
    assert acted["trimmed_turns"] is None and acted["compactions"] is None and acted["memories_recalled"] is None
    assert what_acted({}, [])["trimmed_turns"] is None  # no run directory: not known


def test_earlier_attempts_and_sub_agents_count_and_the_workspace_does_not(
    runs: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(runs["trimmed"][0] / "tasks", run_dir / "tasks")
    before = what_acted({}, [], run_dir=run_dir)["trimmed_turns"]
    task = run_dir / "tasks" / "sample-04-temperature-range"
    records = sorted(task.glob("turn_*/*_trim_history/output.json"))
    trimmed = next(p.parent for p in records if json.loads(p.read_text())["context_budget"]["dropped_turns"])
    for copy in (
        task / "attempts" / "1" / "turn_003" / trimmed.name,
        task / "turn_002" / "subagents" / "analyst-call_1" / "turn_002" / trimmed.name,
        task / "workspace" / "turn_003" / trimmed.name,  # a file the tools wrote, not a record
    ):
        shutil.copytree(trimmed, copy)
    assert what_acted({}, [], run_dir=run_dir)["trimmed_turns"] == before + 2


def test_each_epoch_counts_with_its_attempts(runs: dict[str, tuple[Path, str]], tmp_path: Path) -> None:
    """A run of experiment.epochs keeps each epoch's turns under epochs/<n>/, each with its own attempts: none of
    them was counted, so an epochs run said "nothing (no ... trimming, compaction, memory ...)" whatever acted."""
    run_dir = tmp_path / "run"
    one = what_acted({}, [], run_dir=runs["trimmed"][0])["trimmed_turns"]
    assert one
    for task in (runs["trimmed"][0] / "tasks").iterdir():
        epochs = run_dir / "tasks" / task.name / "epochs"
        for epoch in ("1", "2"):
            for turn in task.glob("turn_*"):
                shutil.copytree(turn, epochs / epoch / turn.name)
        for turn in task.glob("turn_*"):
            shutil.copytree(turn, epochs / "2" / "attempts" / "1" / turn.name)
    assert what_acted({}, [], run_dir=run_dir)["trimmed_turns"] == 3 * one


async def test_tool_server_restarts_are_read_from_the_runs_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pool's own restart message, written the way the run's log writes it, is what the summary counts."""
    state = tmp_path / "state"
    state.mkdir()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    caplog.set_level(logging.WARNING, logger="flowllm.tools")
    async with open_tool_pool(flaky_config(state), workspace) as pool:
        result = await pool.call("flaky", "crash_once", {"name": "a"}, call_id="c1", timeout_s=30)
    assert not result.is_error
    log_format = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    lines = [log_format.format(record) for record in caplog.records]
    (tmp_path / RUN_LOG).write_text("\n".join(["[x][flowllm][INFO] - something else", *lines]) + "\n")

    assert tool_server_restarts(tmp_path / RUN_LOG) == {"flaky": 1}
    acted = what_acted({}, [], run_dir=tmp_path)
    assert acted["tool_server_restarts"] == {"flaky": 1}
    assert "1 tool-server restart (flaky: 1)" in acted_row(acted)
    assert tool_server_restarts(tmp_path / "no-such.log") is None
