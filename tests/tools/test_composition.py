"""Every kind of tool server at once, as shipped: +experiment=web_sample (the web tools, their fixture server,
vision, audio) with a remote streamable-HTTP server (url:), a task-scoped stdio server beside the run-scoped
built-ins, and a sub-agent, over two worker processes. Each server is really called, and every answer is
computed from what it returned."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.appfork import run_app
from tests.compat.server import stop_process

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
SERVERS = Path(__file__).parent / "servers"

pytest.importorskip("markitdown")
pytest.importorskip("trafilatura")

EXTRA_TASKS = [
    # The remote server shouts a word; the task's own stdio server echoes it back as a label.
    {"task_id": "compose-remote-and-task", "Question": "Shout 'gull', then sleep on it.", "Level": 1,
     "Final answer": "slept 0 GULL", "file_name": ""},
    # A sub-agent computes with Python and reports the number.
    {"task_id": "compose-delegate", "Question": "What is 6 times 7?", "Level": 1, "Final answer": "42",
     "file_name": ""},
]  # fmt: skip
EXTRA_SCRIPT = {
    "compose-remote-and-task": [
        {"tool_calls": [{"name": "remote-shout", "input": {"text": "gull"}}]},
        {"tool_calls": [{"name": "flaky-sleep", "input": {"seconds": 0, "label": "${last_tool_result}"}}]},
        {"text": "\\boxed{${last_tool_result}}"},
    ],
    "compose-delegate": [
        {"tool_calls": [{"name": "agent-analyst-execute_subtask", "input": {"subtask": "Compute 6 * 7."}}]},
        {"text": "\\boxed{${last_tool_result}}"},
    ],
    "compose-delegate/analyst": [
        {"tool_calls": [{"name": "tool-python-run_python", "input": {"code": "print(6 * 7)"}}]},
        {"text": "${last_tool_result}"},
    ],
}


@pytest.fixture
def remote_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(SERVERS / "remote_server.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the socket listens; a hang guard is the test timeout
        assert line.startswith("listening on "), f"the remote server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[-1])}/mcp"
    finally:
        stop_process(proc)


def test_every_kind_of_server_composes_in_one_run_over_two_workers(tmp_path: Path, remote_url: str) -> None:
    data = tmp_path / "data"
    shutil.copytree(ROOT / "flowllm" / "data" / "web_sample", data)
    with (data / "metadata.jsonl").open("a") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in EXTRA_TASKS)
    script = yaml.safe_load((data / "script.yaml").read_text())
    script["tasks"].update(EXTRA_SCRIPT)
    (data / "script.yaml").write_text(yaml.safe_dump(script, sort_keys=False))
    run_dir = tmp_path / "run"
    # Hydra's override grammar: unquoted keys, quoted values.
    flaky = (
        f"{{command: python, args: ['{SERVERS / 'flaky_server.py'}'], scope: task, env: {{FLAKY_STATE: '{tmp_path}'}}}}"
    )
    proc = run_app(
        [
            "+experiment=web_sample",
            "+subagents=analyst",
            "experiment.workers=2",
            "experiment.max_concurrent=2",
            "progress=false",
            f"dataset.path={data}",
            f"provider.emulator_script={data / 'script.yaml'}",
            f"+tools.servers.remote={{url: '{remote_url}'}}",
            f"+tools.servers.flaky={flaky}",
            "~tools.servers.tool-math",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        timeout=900,  # a hang guard only
        env={k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"] == summary["completed"] == 12, summary
    assert summary["correct"] == 12 and summary["failed_tool_calls"] == 0, summary
    tasks = run_dir / "tasks"
    remote = json.loads(
        (tasks / "compose-remote-and-task" / "turn_001" / "07_dispatch_tools" / "output.json").read_text()
    )
    assert remote["tool_results"][0]["server"] == "remote" and remote["tool_results"][0]["content"] == "GULL"
    sub = tasks / "compose-delegate" / "turn_001" / "subagents"
    assert [p.name for p in sub.iterdir()] == ["analyst-call_0"] or len(list(sub.iterdir())) == 1
    vision = json.loads((tasks / "web-10-image-question" / "result.json").read_text())
    assert vision["correct"] is True
