"""The whole app as a user runs it: `python -m flowllm` in a fresh interpreter, offline, through the real SDK,
the loopback emulator and real MCP tool servers. The three runners must leave identical artifacts. The other
runs here (a turn limit, user errors) are forked with the app imported (tests/appfork.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flowllm.engine.recorder import read_json
from flowllm.tools.sandbox.execute import probe_bwrap
from tests.appfork import run_app

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = ("legacy", "graph", "graph_parallel")
NODES = [
    "01_trim_history",
    "02_mark_cache",
    "03_call_model",
    "04_normalize",
    "05_parse_tool_calls",
    "06_repair_arguments",
    "07_dispatch_tools",
]


def flowllm(
    *overrides: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowllm", "progress=false", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def forked_flowllm(
    *overrides: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return run_app(["progress=false", *overrides], cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")

    def one(runner: str) -> tuple[str, Path]:
        run_dir = base / runner
        proc = flowllm(f"runner={runner}", f"hydra.run.dir={run_dir}")
        assert proc.returncode == 0, f"{runner} run failed:\n{proc.stdout}\n{proc.stderr}"
        return runner, run_dir

    with ThreadPoolExecutor(len(RUNNERS)) as pool:
        return dict(pool.map(one, RUNNERS))


def test_sample_run_scores_every_task(runs: dict[str, Path]) -> None:
    summary = read_json(runs["graph_parallel"] / "summary.json")
    assert summary["tasks"] == summary["completed"] >= 8
    assert summary["failed"] == 0
    assert summary["accuracy"] == 1.0, summary
    assert summary["usage"]["input_tokens"] > 0 and summary["usage"]["output_tokens"] > 0
    # The sample's replies need more than strict JSON: the repair stages really ran.
    assert set(summary["repairs"]) - {"strict"}, summary["repairs"]
    # run_python's sandbox was probed once before the first task: as root every part of it holds; otherwise
    # bubblewrap builds it where it works (leaving at most the cgroup), else the fallback's gaps are listed (and
    # were warned about on the console).
    gaps = summary["tools"]["sandbox_gaps"]
    if os.geteuid() == 0:
        assert gaps == []
    elif probe_bwrap().path is not None:
        assert set(gaps) <= {"cgroup"}, gaps
    else:
        assert "privileges" in gaps and "filesystem" in gaps, gaps


def test_run_directory_layout(runs: dict[str, Path]) -> None:
    task_dir = runs["graph"] / "tasks" / "sample-01-csv-revenue"
    result = read_json(task_dir / "result.json")
    assert result["status"] == "completed" and result["correct"] is True
    assert result["answer"] == result["ground_truth"] == "5259.18"
    # The built-in servers serve the whole run: they start once, before the first task, and that start-up is
    # the run's own step in summary.json, not a part of any task's time (timing.json says none of it is).
    timing = read_json(task_dir / "timing.json")
    assert timing["tools_start_s"] == [0.0] and timing["wall_seconds"] > 0
    assert read_json(runs["graph"] / "summary.json")["tools"]["start_s"] > 0
    assert set(result) >= {
        "task_id",
        "status",
        "answer",
        "ground_truth",
        "correct",
        "turns",
        "usage",
        "error",
    }
    turn = task_dir / "turn_001"
    assert sorted(p.name for p in turn.iterdir()) == NODES
    for node in NODES:
        assert {p.name for p in (turn / node).iterdir()} == {"input.json", "output.json", "meta.json"}
    call = read_json(turn / "03_call_model" / "output.json")
    assert call["raw_request"]["model"] and call["raw_response"]["content"]
    dispatched = read_json(turn / "07_dispatch_tools" / "output.json")
    assert dispatched["tool_results"][0]["content"].strip() == "5259.18"


def _artifacts(run_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted((run_dir / "tasks").rglob("*.json"))
        if p.name in ("input.json", "output.json")
    }


def test_three_runners_leave_identical_artifacts(runs: dict[str, Path]) -> None:
    reference = _artifacts(runs["legacy"])
    assert len(reference) > 100
    for runner in ("graph", "graph_parallel"):
        other = _artifacts(runs[runner])
        assert other.keys() == reference.keys()
        different = [name for name in reference if reference[name] != other[name]]
        assert not different, f"{runner} differs from legacy in {different[:5]}"


def test_results_agree_across_runners(runs: dict[str, Path]) -> None:
    def results(run_dir: Path) -> dict[str, tuple]:
        return {
            p.parent.name: (d["answer"], d["correct"], d["turns"], d["tool_calls"])
            for p in (run_dir / "tasks").glob("*/result.json")
            for d in [read_json(p)]
        }

    assert results(runs["legacy"]) == results(runs["graph"]) == results(runs["graph_parallel"])


def test_max_turns_ends_with_a_summary_turn(tmp_path: Path) -> None:
    proc = forked_flowllm("agent.max_turns=1", "dataset.task_ids=[sample-02-word-count]", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    result = read_json(tmp_path / "tasks" / "sample-02-word-count" / "result.json")
    # Turn 1 called a tool, the limit was reached, turn 2 asked for the final answer without tools.
    assert result["turns"] == 2 and result["stop"] == "max_turns"
    request = read_json(tmp_path / "tasks" / "sample-02-word-count" / "turn_002" / "03_call_model" / "input.json")
    last_user = request["prompt_messages"][-1]
    assert "final answer" in last_user["content"][-1]["text"]


@pytest.mark.parametrize(
    ("overrides", "env", "needle"),
    [
        (["provider=nope"], {}, "provider=nope: no such option"),
        (["dataset.path=no/such/folder"], {}, "dataset folder 'no/such/folder' does not exist"),
        (["pipeline.nodes.normalize._target_=flowllm.nodes.model.Nope"], {}, "unknown _target_"),
        (["+pipeline.nodes.trim_history.inputs={messages: next_messages}"], {}, "cycle"),
        (["provider=claude"], {"ANTHROPIC_API_KEY": ""}, "ANTHROPIC_API_KEY"),
        (["agent.max_turns=abc"], {}, "agent.max_turns"),
        (["recorder.snapshot=sometimes"], {}, "recorder.snapshot"),
    ],
)
def test_user_errors_are_one_clear_line(overrides: list[str], env: dict[str, str], needle: str, tmp_path: Path) -> None:
    proc = forked_flowllm(*overrides, f"hydra.run.dir={tmp_path}", env=env, timeout=600)
    assert proc.returncode != 0
    assert needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "tasks").exists()  # nothing started
