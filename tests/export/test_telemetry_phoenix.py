"""OpenTelemetry spans received by a real Arize Phoenix on loopback, live and after the fact.

Checked through Phoenix's REST API: how many spans, their names, the GenAI attributes, and the parent links
(task > turn > chat / execute_tool > invoke_agent > turn...). The live spans of a run and the spans exported
afterwards from its folder are the same.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.appfork import run_app
from tests.export.phoenix import Phoenix, phoenix_binary, run_phoenix
from tests.export.runs import export_run

pytest.importorskip(
    "opentelemetry.sdk", reason='the OpenTelemetry SDK is not installed (pip install "flowllm[telemetry]")'
)
BINARY = phoenix_binary()
if BINARY is None:
    pytest.skip(
        "Arize Phoenix is absent: set FLOWLLM_PHOENIX to its phoenix executable, or run .ci/run (it installs one "
        "into .ci-phoenix)",
        allow_module_level=True,
    )

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    assert BINARY is not None
    with run_phoenix(BINARY, tmp_path_factory.mktemp("phoenix")) as server:
        yield server


def expected_spans(run: Path) -> Counter[str]:
    """Span kinds the run's folder calls for: a task, each turn, each model call, each tool call, each sub-agent."""
    tasks = run / "tasks"
    tools = sum(
        len(json.loads(p.read_text(encoding="utf-8"))["tool_results"])
        for p in tasks.glob("**/turn_*/*_dispatch_tools/output.json")
    )
    return Counter(
        {
            "task": len(list(tasks.glob("*/result.json"))),
            "turn": len(list(tasks.glob("**/turn_*/"))),
            "chat": len(list(tasks.glob("**/turn_*/*_call_model/"))),
            "execute_tool": tools,
            "invoke_agent": len(list(tasks.glob("*/turn_*/subagents/*/"))),
        }
    )


def export_otlp(run: Path, url: str) -> subprocess.CompletedProcess[str]:
    args = ["export", str(run), "--format", "otlp", "--endpoint", url]
    return run_app(args, module="flowllm.inspect", cwd=PROJECT_ROOT, env=dict(os.environ), timeout=600)


def signature(spans: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """A trace without ids and times: each span's name, its parent's name and the attributes that matter."""
    by_id = {s["context"]["span_id"]: s for s in spans}
    keys = (
        "gen_ai.operation.name",
        "gen_ai.tool.name",
        "gen_ai.tool.call.id",
        "gen_ai.agent.name",
        "flowllm.turn",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
    )
    return sorted(
        (
            s["name"],
            by_id[s["parent_id"]]["name"] if s["parent_id"] else None,
            tuple(str(s["attributes"].get(k)) for k in keys),
        )
        for s in spans
    )


def check_structure(run: Path, spans: list[dict[str, Any]]) -> None:
    kinds = Counter(s["name"].split(" ")[0] for s in spans)
    assert kinds == expected_spans(run)
    by_id = {s["context"]["span_id"]: s for s in spans}
    traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        traces[span["context"]["trace_id"]].append(span)
    assert len(traces) == kinds["task"]  # one trace per task
    for trace in traces.values():
        roots = [s for s in trace if s["parent_id"] is None]
        assert [r["name"].split(" ")[0] for r in roots] == ["task"]
        assert all(s["parent_id"] in by_id for s in trace if s["parent_id"])  # no dangling parent
    parent = {s["context"]["span_id"]: by_id.get(s["parent_id"] or "") for s in spans}
    for span in spans:
        kind, up = span["name"].split(" ")[0], parent[span["context"]["span_id"]]
        if kind in ("chat", "execute_tool"):
            assert up is not None and up["name"].startswith("turn ")
        if kind == "turn":
            assert up is not None and up["name"].split(" ")[0] in ("task", "invoke_agent")
        if kind == "invoke_agent":
            assert up is not None and up["name"] == "execute_tool execute_subtask"
            assert span["attributes"]["gen_ai.tool.call.id"] == up["attributes"]["gen_ai.tool.call.id"] == "call_0"


def check_attributes(run: Path, spans: list[dict[str, Any]]) -> None:
    chats = [s for s in spans if s["name"].startswith("chat ")]
    normalized = [
        json.loads(p.read_text(encoding="utf-8"))["response"]
        for p in sorted((run / "tasks").glob("**/turn_*/*_normalize/output.json"))
    ]
    assert sorted(s["attributes"]["gen_ai.usage.output_tokens"] for s in chats) == sorted(
        r["usage"]["output_tokens"] for r in normalized
    )
    for chat in chats:
        attrs = chat["attributes"]
        assert chat["name"] == "chat flowllm-emulator"
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == attrs["gen_ai.system"] == "anthropic"
        assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == "flowllm-emulator"
        assert attrs["gen_ai.response.finish_reasons"] == ["end_turn"]
        assert attrs["gen_ai.usage.input_tokens"] > 0 and "gen_ai.usage.cache_read.input_tokens" in attrs
        assert attrs["flowllm.node"] == "call_model" and attrs["flowllm.turn"] >= 1
    tools = [s for s in spans if s["name"].startswith("execute_tool ")]
    assert sorted(s["attributes"]["gen_ai.tool.name"] for s in tools) == sorted(
        ["execute_subtask", "run_python", "run_python"]
    )
    assert all(s["attributes"]["gen_ai.operation.name"] == "execute_tool" for s in tools)
    tasks = {s["attributes"]["flowllm.task_id"]: s for s in spans if s["name"].startswith("task ")}
    assert set(tasks) == {"delegate", "wrong"}
    assert tasks["wrong"]["attributes"]["flowllm.correct"] is False
    assert tasks["delegate"]["attributes"]["flowllm.correct"] is True


def test_a_saved_run_exported_after_the_fact(phoenix: Phoenix, saved_run: Path) -> None:
    done = export_otlp(saved_run, phoenix.url)
    assert done.returncode == 0, done.stderr
    total = sum(expected_spans(saved_run).values())
    assert f"sent {total} span(s) of 2 task(s)" in done.stdout
    spans = phoenix.wait_for(saved_run, total)
    assert len(spans) == total
    check_structure(saved_run, spans)
    check_attributes(saved_run, spans)


def test_live_spans_are_the_spans_of_the_saved_run(phoenix: Phoenix, tmp_path: Path) -> None:
    run = export_run(tmp_path, f"telemetry.otlp_endpoint={phoenix.url}").check().run_dir
    total = sum(expected_spans(run).values())
    live = phoenix.wait_for(run, total)
    assert len(live) == total
    check_structure(run, live)
    check_attributes(run, live)
    assert "telemetry" not in run.joinpath("app.log").read_text(encoding="utf-8")  # no warning

    assert export_otlp(run, phoenix.url).returncode == 0
    both = phoenix.wait_for(run, 2 * total)
    later = [s for s in both if s["context"]["trace_id"] not in {x["context"]["trace_id"] for x in live}]
    by_task: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)
    for group in (live, later):
        traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for span in group:
            traces[span["context"]["trace_id"]].append(span)
        for trace in traces.values():
            by_task[trace[0]["attributes"]["flowllm.task_id"]].append(trace)
    for task_id, (live_trace, saved_trace) in by_task.items():
        assert signature(live_trace) == signature(saved_trace), task_id


def test_live_spans_from_worker_processes(phoenix: Phoenix, tmp_path: Path) -> None:
    """Under experiment.workers=2 each worker sends the spans of its own tasks."""
    run = export_run(tmp_path, f"telemetry.otlp_endpoint={phoenix.url}", "experiment.workers=2").check().run_dir
    total = sum(expected_spans(run).values())
    spans = phoenix.wait_for(run, total)
    assert len(spans) == total
    check_structure(run, spans)
    check_attributes(run, spans)
