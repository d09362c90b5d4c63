"""+experiment=web_sample end to end, as a user runs it (python -m flowllm in its own process): the loopback web
fixture server, flowllm's search/browse/files servers and the emulator; every task scored under all three
runners. The script computes each answer from the tool results, so a broken tool lowers the score."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.appfork import run_app

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
RUNNERS = ("legacy", "graph", "graph_parallel")

pytest.importorskip("markitdown")
pytest.importorskip("trafilatura")


def run(runner: str, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return run_app(
        [
            "+experiment=web_sample",
            "progress=false",
            f"runner={runner}",
            # The runs go one after the other, three tasks at once each; the calculator no task uses stays off
            # (one tool server process fewer).
            "experiment.max_concurrent=3",
            "~tools.servers.tool-math",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        timeout=900,  # a hang guard only
        env={k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
    )


def test_web_sample_scores_every_task_under_every_runner(tmp_path: Path) -> None:
    for runner in RUNNERS:
        proc = run(runner, tmp_path / runner)
        assert proc.returncode == 0, f"{runner}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        summary = json.loads((tmp_path / runner / "summary.json").read_text())
        assert summary["tasks"] == summary["completed"] == 10, (runner, summary)
        assert summary["accuracy"] == 1.0, (runner, summary)
    # What the model was shown is in the run directory: the search results and the page text.
    dispatch = tmp_path / "graph" / "tasks" / "web-01-search-then-read" / "turn_003" / "07_dispatch_tools"
    shown = json.loads((dispatch / "output.json").read_text())["tool_results"][0]
    assert shown["server"] == "tool-browse" and "| Height | 38 m |" in shown["content"]
    assert "cookie" not in shown["content"].lower()
