"""The spans themselves, in process, with the OpenTelemetry SDK's in-memory exporter (no receiver needed): the
live listener, fed a saved run's node events in the order they ran, builds the spans an export of the saved run
builds; the nesting and the GenAI attributes; a listener bug never reaches the run."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from flowllm.engine.recorder import read_json
from flowllm.export.source import open_source
from flowllm.export.trace import parse_time

pytest.importorskip(
    "opentelemetry.sdk", reason='the OpenTelemetry SDK is not installed (pip install "flowllm[telemetry]")'
)

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flowllm.telemetry.exporter import ExportStatus, SpanPipeline
from flowllm.telemetry.live import LiveTelemetry
from flowllm.telemetry.spans import SpanBuilder

URL = "http://127.0.0.1:1/v1/traces"  # never contacted: the spans stay in memory


def in_memory() -> tuple[SpanPipeline, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return SpanPipeline(URL, provider, ExportStatus(URL)), memory


def after_the_fact(run: Path) -> list[ReadableSpan]:
    pipeline, memory = in_memory()
    builder = SpanBuilder(pipeline.tracer, str(run))
    for trace in open_source(run).finished:
        builder.task(trace)
    return list(memory.get_finished_spans())


def node_events(
    run: Path, task_id: str, epoch: int | None = None
) -> list[tuple[float, str, int, str, int | None, Path]]:
    """(start, scope, turn, node, index, folder) of every node of a task (or of one of its epochs), sub-agents'
    included, in start order."""
    task = run / "tasks" / task_id
    if epoch is not None:
        task = task / "epochs" / str(epoch)
    events = []
    for meta_path in task.glob("**/turn_*/*/meta.json"):
        folder = meta_path.parent
        turn_dir = folder.parent
        scope = turn_dir.parent.relative_to(task).as_posix()
        index, _, name = folder.name.partition("_")
        meta = read_json(meta_path)
        events.append(
            (
                parse_time(meta["started_at"]) or 0.0,
                "" if scope == "." else scope,
                int(turn_dir.name.split("_")[1]),
                name,
                int(index),
                folder,
            )
        )
    return sorted(events)


def live(run: Path) -> list[ReadableSpan]:
    pipeline, memory = in_memory()
    listener = LiveTelemetry(pipeline, run, orjson.dumps)
    for task_id in ("delegate", "wrong"):
        for _start, scope, turn, name, index, folder in node_events(run, task_id):
            ctx = SimpleNamespace(task_id=task_id, turn=turn, scope=scope, agent="main")
            node = SimpleNamespace(name=name, index=index)
            listener.on_node(
                ctx,
                node,
                read_json(folder / "input.json"),
                read_json(folder / "output.json"),  # type: ignore[arg-type]
                read_json(folder / "meta.json"),
            )
        listener.finish_task(task_id, read_json(run / "tasks" / task_id / "result.json"))
    return list(memory.get_finished_spans())


def signature(spans: list[ReadableSpan]) -> list[tuple[Any, ...]]:
    by_id = {s.context.span_id: s for s in spans}
    return sorted(
        (
            s.name,
            by_id[s.parent.span_id].name if s.parent is not None else None,
            s.start_time,
            s.end_time,
            tuple(sorted((k, str(v)) for k, v in (s.attributes or {}).items())),
        )
        for s in spans
    )


def test_live_spans_equal_the_spans_of_the_saved_run(saved_run: Path) -> None:
    saved, streamed = after_the_fact(saved_run), live(saved_run)
    assert len(saved) == 18  # delegate 12 (its sub-agent 5 of them), wrong 6
    assert signature(streamed) == signature(saved)


def test_spans_nest_and_carry_the_genai_attributes(saved_run: Path) -> None:
    spans = after_the_fact(saved_run)
    by_id = {s.context.span_id: s for s in spans}
    parent = {s.name + str(s.context.span_id): by_id[s.parent.span_id].name if s.parent else None for s in spans}
    agent = next(s for s in spans if s.name == "invoke_agent analyst")
    assert agent.parent is not None and by_id[agent.parent.span_id].name == "execute_tool execute_subtask"
    assert len({s.context.trace_id for s in spans}) == 2  # one trace per task
    assert sum(1 for p in parent.values() if p is None) == 2
    chat = next(s for s in spans if s.name == "chat flowllm-emulator")
    attrs = dict(chat.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "anthropic"
    assert {
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.response.finish_reasons",
        "gen_ai.request.model",
        "flowllm.run_dir",
    } <= set(attrs)
    tool = next(s for s in spans if s.name == "execute_tool run_python")
    assert tool.attributes is not None and tool.attributes["gen_ai.tool.call.id"] == "call_0"
    assert tool.start_time is not None and tool.end_time is not None and tool.end_time >= tool.start_time


def test_a_bug_in_span_building_is_one_warning_and_never_raises(
    saved_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline, memory = in_memory()
    listener = LiveTelemetry(pipeline, saved_run, orjson.dumps)
    ctx = SimpleNamespace(task_id="t", turn=1, scope="", agent="main")
    node = SimpleNamespace(name="call_model", index=3)
    with caplog.at_level(logging.WARNING, logger="flowllm.telemetry.live"):
        for _ in range(3):  # an output that cannot be serialised: the listener's problem, not the run's
            listener.on_node(ctx, node, {}, {"raw_response": object()}, {"status": "ok"})  # type: ignore[arg-type]
        listener.finish_task("t", {"status": "completed"})
    assert len([r for r in caplog.records if "telemetry" in r.getMessage()]) == 1
    assert memory.get_finished_spans() == ()
