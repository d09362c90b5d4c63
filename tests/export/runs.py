"""A small real run for the export tests, made with ``python -m flowllm`` against the emulator.

Its dataset (written here, GAIA's format) has three tasks; the run selects two of them, so the third is in the
split but was never run (a GAIA submission must still list it):

* ``delegate``: the main agent hands a sub-task to the ``analyst`` sub-agent, which runs Python; correct;
* ``wrong``: one Python call, then a wrong answer;
* ``not-run``: not selected.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from tests.agent.test_subagents import DELEGATE
from tests.agent.test_subagents import PYTHON as SQUARES  # the analyst's Python call
from tests.appfork import run_app
from tests.replay.runs import PROJECT_ROOT, Finished, run_flowllm

PYTHON = """<use_mcp_tool>
<server_name>tool-python</server_name>
<tool_name>run_python</tool_name>
<arguments>{"code": "print(6 * 7)"}</arguments>
</use_mcp_tool>"""

SCRIPT = {
    "tasks": {
        "delegate": [
            {"text": DELEGATE},
            {"text": "The analyst says ${last_tool_result}. \\boxed{${last_tool_result}}"},
        ],
        "delegate/analyst": [{"text": SQUARES}, {"text": "${last_tool_result}"}],
        "wrong": [{"text": PYTHON}, {"text": "It is \\boxed{41}"}],
    }
}
ROWS = [
    {"task_id": "delegate", "Question": "Sum of squares 1..10?", "Level": 1, "Final answer": "385"},
    {"task_id": "wrong", "Question": "What is six times seven?", "Level": 2, "Final answer": "42"},
    {"task_id": "not-run", "Question": "Never asked.", "Level": 3, "Final answer": "0"},
]
RUN_TASKS = ("delegate", "wrong")
SPLIT = tuple(r["task_id"] for r in ROWS)


def write_dataset(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    (folder / "script.yaml").write_text(yaml.safe_dump(SCRIPT), encoding="utf-8")
    return folder


def export_run(base: Path, *overrides: str) -> Finished:
    """The run, into ``base/run`` (its dataset in ``base/data``); extra overrides (telemetry) are appended."""
    data = write_dataset(base / "data")
    return run_flowllm(
        base / "run",
        "+subagents=analyst",
        f"dataset.path={data}",
        f"provider.emulator_script={data / 'script.yaml'}",
        f"dataset.task_ids=[{','.join(RUN_TASKS)}]",
        "~tools.servers.tool-files",
        *overrides,
    )


def flowllm_export(run: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m flowllm.inspect export RUN ...`` as a user runs it."""
    return run_app(
        ["export", str(run), *args], module="flowllm.inspect", cwd=PROJECT_ROOT, env=dict(os.environ), timeout=600
    )
