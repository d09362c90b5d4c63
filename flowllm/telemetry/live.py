"""Spans while a run runs (``telemetry.otlp_endpoint=URL``): a run listener on the recorder.

It sees every node as it ends (the recorder hands it the same exchange it records, whatever
``recorder.snapshot`` keeps), keeps per task only what a span needs (timings, the reply's model, usage and stop
reason, the tool calls and results: ``TurnBuilder``), and when the task's result is written emits the task's
spans (a task run over epochs: one trace per epoch, from the epoch's entry in the task's ``epoch_log``),
which the SDK's batch processor sends from its own thread. Nothing here may slow or fail the run: an
unreachable endpoint is one warning at the start (and no telemetry), a receiver that fails later one warning,
and a bug in span building one warning per run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from flowllm.errors import BuildError, ConfigError
from flowllm.export.trace import Conversation, NodeEvent, TaskTrace, TurnBuilder, parse_time
from flowllm.providers.replay import REPLAY_PROTOCOL
from flowllm.rundir.epochs import current_epoch
from flowllm.rundir.layout import SUBAGENTS_DIR, TURN_RE, RunLayout
from flowllm.rundir.results import TaskResult
from flowllm.telemetry.exporter import (
    EndpointError,
    SpanPipeline,
    TelemetryUnavailable,
    open_pipeline,
    require_sdk,
    traces_url,
)
from flowllm.telemetry.spans import SpanBuilder

if TYPE_CHECKING:
    from flowllm.engine.context import TurnContext
    from flowllm.engine.node import BoundNode
    from flowllm.engine.recorder import Recorder

log = logging.getLogger(__name__)


def _parent_of(scope: str) -> tuple[str, int, str, str] | None:
    """(parent scope, parent turn, agent, call id) of a sub-agent's scope ``.../turn_002/subagents/name-call``."""
    parts = scope.split("/")
    if len(parts) < 3 or parts[-2] != SUBAGENTS_DIR:
        return None
    match = TURN_RE.match(parts[-3])
    if match is None:
        return None
    agent, _, call_id = parts[-1].rpartition("-")
    return "/".join(parts[:-3]), int(match.group(1)), agent or parts[-1], call_id


class LiveTelemetry:
    """A run listener (``flowllm.engine.recorder.RunListener``) that turns each finished task into spans."""

    records_nodes = True
    reads_meta = True  # a span's start, duration and status

    def __init__(
        self, pipeline: SpanPipeline, run_dir: Path, dumps: Callable[[Any], bytes], *, replay: bool = False
    ) -> None:
        self.pipeline = pipeline
        self.run_dir = run_dir
        self.replay = replay  # a replay or fork: only the forked calls are made (and billed) by this run
        self.dumps = dumps  # the recorder's redacting serialiser: no secret reaches the receiver
        self.spans = SpanBuilder(pipeline.tracer, str(run_dir))
        # (task, epoch: None without experiment.epochs) -> its turns so far, by (scope, turn)
        self._tasks: dict[tuple[str, int | None], dict[tuple[str, int], TurnBuilder]] = {}
        self._lock = threading.Lock()
        self._broken = False

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None:
        if self._broken:
            return
        try:
            with self._lock:
                turns = self._tasks.setdefault((ctx.task_id, current_epoch()), {})
                builder = turns.get((ctx.scope, ctx.turn))
                if builder is None:
                    builder = TurnBuilder(ctx.turn, keep_prompt=False, replay=self.replay)
                    turns[(ctx.scope, ctx.turn)] = builder
            event = NodeEvent(
                node.name,
                node.index,
                parse_time(meta.get("started_at")),
                meta.get("duration_s"),
                str(meta.get("status") or "ok"),
                meta.get("error"),
            )
            values = orjson.loads(self.dumps(builder.pick(outputs))) if outputs and builder.wants(outputs) else None
            builder.add(event, values)
        except Exception as exc:  # never the run's problem
            self._fail(exc)

    def discard_task(self, task_id: str) -> None:
        """An attempt that will be retried: the running epoch's turns only (the other epochs' stay)."""
        with self._lock:
            self._tasks.pop((task_id, current_epoch()), None)

    def finish_task(self, task_id: str, result: TaskResult | Mapping[str, Any]) -> None:
        with self._lock:
            runs = {key[1]: self._tasks.pop(key) for key in [k for k in self._tasks if k[0] == task_id]}
        if self._broken:
            return
        try:
            saved = TaskResult.coerce(result)
            entries: list[Any] = saved.epoch_log if isinstance(saved.epoch_log, list) else []
            if None in runs or not (runs or entries):
                folder = RunLayout(self.run_dir).task(task_id)
                trace = TaskTrace(task_id, 1, folder, saved, None, self._tree(runs.get(None, {})))
                self.spans.task(trace)
            by_epoch = {e.get("epoch"): e for e in entries if isinstance(e, Mapping)}
            layout = RunLayout(self.run_dir)
            # Epochs kept from an earlier session ran no node here: their spans were that session's.
            for epoch in sorted(n for n in runs if n is not None):
                self.spans.task(
                    TaskTrace(
                        task_id=task_id,
                        epoch=epoch,
                        folder=layout.epoch(task_id, epoch),
                        result=TaskResult.from_dict({"task_id": task_id, **by_epoch.get(epoch, {})}),
                        timing=None,
                        conversation=self._tree(runs[epoch]),
                        epoch_folder=True,
                        task_result=saved,
                    )
                )
        except Exception as exc:
            self._fail(exc)

    @staticmethod
    def _tree(builders: dict[tuple[str, int], TurnBuilder]) -> Conversation:
        """The task's conversation, each sub-agent's under the turn that started it."""
        convs: dict[str, Conversation] = {"": Conversation("main", "", None)}
        for scope in sorted({s for s, _ in builders}, key=lambda s: s.count("/")):
            if scope and scope not in convs:
                parent = _parent_of(scope)
                agent, call_id = (parent[2], parent[3]) if parent else (scope, None)
                convs[scope] = Conversation(agent, scope, call_id)
        turns = {key: builders[key].build() for key in sorted(builders, key=lambda k: (k[0].count("/"), k))}
        for (scope, _number), turn in turns.items():
            convs[scope].turns.append(turn)
        for scope, conv in convs.items():
            if not scope:
                continue
            parent = _parent_of(scope)
            host = turns.get((parent[0], parent[1])) if parent is not None else None
            if host is None and convs[""].turns:
                host = convs[""].turns[-1]  # its turn was not seen: keep it in the trace, under the last turn
            if host is not None:
                host.subagents.append(conv)
        for conv in convs.values():
            conv.turns.sort(key=lambda t: t.number)
        return convs[""]

    def _fail(self, exc: Exception) -> None:
        if not self._broken:
            self._broken = True
            log.warning("telemetry: span building failed (%s: %s); no more spans this run", type(exc).__name__, exc)

    def close(self) -> None:
        try:
            self.pipeline.close()
        except Exception as exc:
            log.warning("telemetry: closing the exporter failed: %s", exc)


def open_live_telemetry(
    endpoint: str | None, run_dir: Path, dumps: Callable[[Any], bytes], *, replay: bool = False
) -> LiveTelemetry | None:
    """The run's listener when ``telemetry.otlp_endpoint`` is set and reachable; else None (and one warning)."""
    if not endpoint:
        return None
    try:
        traces_url(endpoint)
    except EndpointError as exc:
        raise BuildError(str(exc)) from None
    try:
        pipeline = open_pipeline(endpoint)
    except (TelemetryUnavailable, EndpointError) as exc:
        log.warning("telemetry: %s; the run goes on without it", exc)
        return None
    return LiveTelemetry(pipeline, run_dir, dumps, replay=replay)


def check_telemetry(endpoint: str | None) -> None:
    """Refuses a ``telemetry.otlp_endpoint`` that is not an http(s) URL, or set without the SDK installed, before
    anything runs (exit 2)."""
    if endpoint:
        try:
            traces_url(str(endpoint))
            require_sdk()
        except (EndpointError, TelemetryUnavailable) as exc:
            raise ConfigError(
                f"telemetry.otlp_endpoint is set, but {exc}" if isinstance(exc, TelemetryUnavailable) else str(exc)
            ) from None


def attach_telemetry(endpoint: str | None, recorder: Recorder, *, protocol: str) -> LiveTelemetry | None:
    """Listen on the run's recorder when ``telemetry.otlp_endpoint`` is set; the caller closes it. ``protocol``:
    the run's provider's (a replay's spans say so)."""
    replay = protocol == REPLAY_PROTOCOL
    live = open_live_telemetry(
        str(endpoint) if endpoint else None, recorder.run_dir, recorder.redactor.dumps, replay=replay
    )
    if live is not None:
        recorder.listeners.append(live)
    return live
