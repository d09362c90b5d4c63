"""A task that fails (the provider refuses its second model call: an injected HTTP 400) in every export: an error
status and ``error.type`` on its spans, an error on its Inspect sample and model event, its failure in the tasks
frame, an empty answer in the GAIA submission."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from flowllm.export.source import open_source
from tests.export.runs import flowllm_export
from tests.replay.runs import run_flowllm

PYTHON = """<use_mcp_tool>
<server_name>tool-python</server_name>
<tool_name>run_python</tool_name>
<arguments>{"code": "print(6 * 7)"}</arguments>
</use_mcp_tool>"""
SCRIPT = {
    "tasks": {"broken": [{"text": PYTHON}, {"text": "\\boxed{42}"}]},
    "faults": {"seed": 1, "rules": [{"fault": "status", "status": 400, "tasks": ["broken"], "turns": [2]}]},
}
ROW = {"task_id": "broken", "Question": "What is six times seven?", "Level": 1, "Final answer": "42"}
REFUSED = "HTTP 400"


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("failed-run")
    data = base / "data"
    data.mkdir()
    (data / "metadata.jsonl").write_text(json.dumps(ROW) + "\n", encoding="utf-8")
    (data / "script.yaml").write_text(yaml.safe_dump(SCRIPT), encoding="utf-8")
    done = run_flowllm(
        base / "run",
        f"dataset.path={data}",
        f"provider.emulator_script={data / 'script.yaml'}",
        "~tools.servers.tool-files",
    )
    return done.check(4).run_dir  # every task that ran failed


def test_the_failed_call_and_task_are_error_spans(failed_run: Path) -> None:
    pytest.importorskip("opentelemetry.sdk", reason='pip install "flowllm[telemetry]"')
    from opentelemetry.trace import StatusCode

    from tests.export.test_telemetry_spans import after_the_fact

    spans = after_the_fact(failed_run)

    def span(name: str, turn: int | None = None) -> Any:
        return next(s for s in spans if s.name.startswith(name) and (s.attributes or {}).get("flowllm.turn") == turn)

    root = span("task broken")
    assert root.status.status_code is StatusCode.ERROR and REFUSED in (root.status.description or "")
    failed_chat = span("chat ", 2)
    assert failed_chat.status.status_code is StatusCode.ERROR
    assert failed_chat.attributes["error.type"] == "ProviderCallError"
    ok_chat = span("chat ", 1)
    assert ok_chat.status.status_code is StatusCode.UNSET and "error.type" not in ok_chat.attributes
    assert span("turn 2", 2).status.status_code is StatusCode.ERROR


def test_the_inspect_sample_carries_the_error(failed_run: Path, tmp_path: Path) -> None:
    log_module = pytest.importorskip("inspect_ai.log", reason='pip install "flowllm[inspect]"')
    target = tmp_path / "failed.eval"
    assert flowllm_export(failed_run, "--format", "inspect", "-o", str(target)).returncode == 0
    sample = log_module.read_eval_log_sample(str(target), id="broken", epoch=1)
    assert sample.error is not None and REFUSED in sample.error.message
    models = [e for e in sample.events if e.event == "model"]
    assert models[0].error is None and models[1].error is not None and REFUSED in models[1].error
    assert sample.scores["gaia"].value == "I"


def test_the_frames_and_the_submission_show_the_failure(failed_run: Path, tmp_path: Path) -> None:
    result = orjson.loads((failed_run / "tasks" / "broken" / "result.json").read_bytes())
    pytest.importorskip("pandas", reason='pip install "flowllm[analysis]"')
    from flowllm import analysis

    row = analysis.load(failed_run).tasks.set_index("task_id").loc["broken"]
    assert row["status"] == "failed" and row["failure"] == result["error"].splitlines()[0]
    target = tmp_path / "answers.jsonl"
    done = flowllm_export(failed_run, "--format", "gaia-submission", "-o", str(target))
    assert done.returncode == 0 and "broken" in done.stdout
    line = json.loads(target.read_text(encoding="utf-8"))
    assert (line["task_id"], line["model_answer"]) == ("broken", "")
    assert "[tool tool-python.run_python] 42" in line["reasoning_trace"]  # what it did before it failed
    assert open_source(failed_run).finished[0].saved.status == "failed"
