"""A task's conversation as a neutral trace: model calls, tool calls and sub-agents with their timings.

Every export reads a run through this module: the Inspect AI log, the OpenTelemetry spans (after the fact, and
live from node events as they happen, through the same ``TurnBuilder``), the GAIA submission's reasoning trace
and the dataframes. A node is recognised by what it produced, not by its name (a pipeline may rename nodes or add
hooks): ``raw_response`` is the model call, the last ``response`` the normalised reply, ``prepared_calls`` the
tool calls with their parsed arguments, ``bad_tool_calls`` the calls that could not be read, ``tool_results``
the dispatch, ``prompt_system`` / ``prompt_messages`` the request as sent.

Tasks are listed by one function, ``task_folders``: a task folder is epoch 1 of its task, and a task of an
``experiment.epochs`` > 1 run is one trace per epoch folder (``tasks/<id>/epochs/<n>/``), each with its own
result, turns and timing, and the task's own (reduced) result beside it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from flowllm.core.types import Usage
from flowllm.rundir.layout import (
    EPOCHS_DIR,
    META_FILE,
    OUTPUT_FILE,
    RESULT_FILE,
    SUBAGENTS_DIR,
    TASKS_DIR,
    TIMING_FILE,
)
from flowllm.rundir.records import NodeRecord, read_artifact, read_turns
from flowllm.rundir.results import TaskResult
from flowllm.scoring.tally import known_score

# The node outputs a trace reads; every other output is skipped (they hold whole histories).
MODEL_KEYS = frozenset({"raw_response", "raw_request"})
# What a fork adds to a live reply (flowllm/providers/fork.py, FORK_KEY): its provider, model, the request sent.
FORK_KEY = "flowllm_fork"
TRACE_KEYS = frozenset(
    {
        "raw_response",
        "raw_request",
        "response",
        "prepared_calls",
        "bad_tool_calls",
        "tool_results",
        "tool_calls",
        "recalled",
    }
)
PROMPT_KEYS = frozenset({"prompt_system", "prompt_messages", "prompt_tools"})


def _forked(call: ModelCall, record: Any) -> None:
    """A fork's live call: the recorded ``raw_request`` is built like the saved run's, so the model asked for is
    the one the live provider was sent (``flowllm_fork``: its provider, model and the request really sent)."""
    if not isinstance(record, dict):
        return
    sent = record.get("request")
    model = sent.get("model") if isinstance(sent, dict) else None
    call.request_model = str(model or record.get("model") or call.request_model or "") or None
    call.provider = call.provider or record.get("provider")  # the route (who answered, a fallback too) first
    call.live = True


def parse_time(value: Any) -> float | None:
    """An ISO timestamp from a ``meta.json`` as seconds since the epoch (None when absent or unreadable)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


@dataclass
class ModelCall:
    """One call of the model (the node that produced ``raw_response``) and its normalised reply."""

    started_at: float | None
    duration_s: float | None
    request_model: str | None = None
    response_model: str | None = None
    provider: str | None = None
    protocol: str | None = None
    response_id: str | None = None
    stop_reason: str | None = None
    text: str = ""
    thinking: str = ""
    usage: dict[str, Any] = field(default_factory=dict)  # empty for a call this run did not make (billed False)
    error: str | None = None
    native_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # False: a replay served the saved run's reply (no call, nothing billed); a fork's live calls are billed.
    billed: bool = True
    live: bool = False  # a fork's call that went to the live provider (provider.live)


@dataclass
class ToolCall:
    """One tool call the model made: parsed (``arguments``), or bad (``error`` says why) and its result."""

    call_id: str
    server: str | None
    name: str
    arguments: dict[str, Any] | None
    arguments_text: str | None = None
    result: str | None = None
    is_error: bool = False
    error: str | None = None
    structured: Any = None  # the result's structured content, as the server sent it
    # The dispatch node's interval: tools of one turn run together and flowllm times the dispatch as a whole.
    started_at: float | None = None
    duration_s: float | None = None


@dataclass
class NodeEvent:
    name: str
    index: int | None
    started_at: float | None
    duration_s: float | None
    status: str
    error: str | None


@dataclass
class Turn:
    number: int
    nodes: list[NodeEvent] = field(default_factory=list)
    model: ModelCall | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    system: list[dict[str, Any]] | None = None
    prompt_messages: list[dict[str, Any]] | None = None
    subagents: list[Conversation] = field(default_factory=list)
    recalled: list[dict[str, Any]] = field(default_factory=list)  # memories put in the prompt (recall_memory)

    @property
    def started_at(self) -> float | None:
        times = [n.started_at for n in self.nodes if n.started_at is not None]
        return min(times) if times else None

    @property
    def ended_at(self) -> float | None:
        ends = [n.started_at + (n.duration_s or 0.0) for n in self.nodes if n.started_at is not None]
        return max(ends) if ends else None

    @property
    def error(self) -> str | None:
        return next((f"{n.name}: {n.error}" for n in self.nodes if n.status == "error"), None)


@dataclass
class Conversation:
    """The turns of one agent: the task's own (``scope`` "") or a sub-agent's, started by a tool call."""

    agent: str
    scope: str
    call_id: str | None
    turns: list[Turn] = field(default_factory=list)

    @property
    def started_at(self) -> float | None:
        times = [t.started_at for t in self.turns if t.started_at is not None]
        return min(times) if times else None

    @property
    def ended_at(self) -> float | None:
        ends = [t.ended_at for t in self.turns if t.ended_at is not None]
        return max(ends) if ends else None


@dataclass
class TaskTrace:
    """One run of a task: the task itself, or one epoch of it (``epoch_folder``) in an epochs run."""

    task_id: str
    epoch: int
    folder: Path
    result: TaskResult | None  # None: the task (epoch) has not finished (or its result.json is unreadable)
    timing: dict[str, Any] | None
    conversation: Conversation
    # An epochs run: ``folder`` is ``tasks/<id>/epochs/<n>/`` and ``task_result`` the task's own result.json
    # (its reduced score; None until every epoch has run). Otherwise ``task_result`` is ``result``.
    epoch_folder: bool = False
    task_result: TaskResult | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def ledger_epoch(self) -> int | None:
        """The ``epoch`` the ledger's lines of this trace carry (None: not an epochs run, the task's lines)."""
        return self.epoch if self.epoch_folder else None

    @property
    def saved(self) -> TaskResult:
        """The result as recorded; an empty one (every field at its default) while the task has not finished."""
        return self.result if self.result is not None else TaskResult.from_dict({})

    @property
    def verdict(self) -> bool | None:
        """Whether this conversation's answer is right, as every tally counts it: None when it has no score (the
        run's budget stopped it, a replay that did not replay, no ground truth, a scoring error)."""
        if self.result is None:
            return None
        r = self.result
        score = known_score(status=r.status, replay=r.replay, correct=r.correct, score_error=r.score_error)
        return None if score is None else score == 1.0

    def all_conversations(self) -> Iterator[Conversation]:
        stack = [self.conversation]
        while stack:
            conv = stack.pop(0)
            yield conv
            for turn in conv.turns:
                stack.extend(turn.subagents)

    def usage(self) -> dict[str, Any]:
        """The task's token counts: its result's; where a replay served some of its replies (none was called for
        again, nothing billed), the calls this run made, sub-agents' included."""
        calls = [t.model for c in self.all_conversations() for t in c.turns if t.model is not None]
        if all(call.billed for call in calls):
            return dict(self.saved.usage)
        billed = [Usage.from_dict(call.usage) for call in calls if call.billed]
        return sum(billed, Usage()).to_dict() if billed else {}


class TurnBuilder:
    """Builds one ``Turn`` from its node events, in the order they finished (live) or in folder order (saved)."""

    def __init__(self, number: int, *, keep_prompt: bool, replay: bool = False) -> None:
        self.turn = Turn(number)
        self.keep_prompt = keep_prompt
        self.replay = replay  # a replay (or fork) run: only its forked calls were made and billed
        self._prepared: list[dict[str, Any]] = []
        self._bad: list[dict[str, Any]] = []
        self._results: list[dict[str, Any]] = []
        self._dispatch: NodeEvent | None = None

    def wants(self, keys: Any) -> bool:
        """Whether a node with these output keys is read (the others cost nothing)."""
        wanted = TRACE_KEYS | PROMPT_KEYS if self.keep_prompt else TRACE_KEYS
        return any(k in wanted for k in keys)

    def pick(self, outputs: Mapping[str, Any]) -> dict[str, Any]:
        """The part of a node's outputs a span needs (not the histories a request or a dispatch carries along)."""
        wanted = TRACE_KEYS | PROMPT_KEYS if self.keep_prompt else TRACE_KEYS
        picked = {k: v for k, v in outputs.items() if k in wanted}
        request = picked.get("raw_request")
        if isinstance(request, Mapping):
            picked["raw_request"] = {"model": request.get("model")}
        return picked

    def add(self, event: NodeEvent, outputs: Mapping[str, Any] | None) -> None:
        self.turn.nodes.append(event)
        out = outputs or {}
        if self.keep_prompt:
            if isinstance(out.get("prompt_system"), list):
                self.turn.system = out["prompt_system"]
            if isinstance(out.get("prompt_messages"), list):
                self.turn.prompt_messages = out["prompt_messages"]
        if event.name == "call_model" or MODEL_KEYS & set(out):
            self._model_call(event, out)
        response = out.get("response")
        if isinstance(response, dict) and self.turn.model is not None:
            self._reply(self.turn.model, response)
        if isinstance(out.get("prepared_calls"), list):
            self._prepared = [p for p in out["prepared_calls"] if isinstance(p, dict)]
        if isinstance(out.get("bad_tool_calls"), list):
            self._bad = [b for b in out["bad_tool_calls"] if isinstance(b, dict)]
        if isinstance(out.get("tool_results"), list):
            self._results = [r for r in out["tool_results"] if isinstance(r, dict)]
            self._dispatch = event
        if isinstance(out.get("recalled"), list):
            self.turn.recalled = [m for m in out["recalled"] if isinstance(m, dict)]

    def _model_call(self, event: NodeEvent, out: Mapping[str, Any]) -> None:
        call = ModelCall(event.started_at, event.duration_s, error=event.error)
        request = out.get("raw_request")
        if isinstance(request, dict) and isinstance(request.get("model"), str):
            call.request_model = request["model"]
        raw = out.get("raw_response")
        if isinstance(raw, dict):
            route = raw.get("flowllm_route")
            if isinstance(route, dict):
                call.provider = route.get("provider")
                call.protocol = route.get("protocol")
                call.request_model = call.request_model or route.get("model")
            if isinstance(raw.get("model"), str):
                call.response_model = raw["model"]
            _forked(call, raw.get(FORK_KEY))
        call.billed = call.live or not self.replay
        self.turn.model = call

    @staticmethod
    def _reply(call: ModelCall, response: Mapping[str, Any]) -> None:
        """The normalised reply; its usage only for a call this run made (a replayed reply was billed before)."""
        call.text = str(response.get("text") or "")
        call.thinking = str(response.get("thinking") or "")
        call.stop_reason = response.get("stop_reason")
        call.response_model = response.get("model") or call.response_model
        call.response_id = response.get("id") or None
        if isinstance(response.get("usage"), dict) and call.billed:
            call.usage = dict(response["usage"])
        natives = response.get("tool_calls")
        call.native_tool_calls = [c for c in natives if isinstance(c, dict)] if isinstance(natives, list) else []

    def build(self) -> Turn:
        results = {str(r.get("call_id")): r for r in self._results}
        started = self._dispatch.started_at if self._dispatch else None
        duration = self._dispatch.duration_s if self._dispatch else None
        calls: list[ToolCall] = []
        for prepared in self._prepared:
            inner = prepared.get("call")
            raw: dict[str, Any] = inner if isinstance(inner, dict) else prepared
            call_id = str(raw.get("id") or "")
            args = prepared.get("arguments")
            calls.append(
                ToolCall(
                    call_id=call_id,
                    server=raw.get("server"),
                    name=str(raw.get("name") or "?"),
                    arguments=args if isinstance(args, dict) else None,
                    arguments_text=raw.get("arguments_text"),
                    error=prepared.get("error"),
                )
            )
        for number, bad in enumerate(self._bad, start=1):
            # A block that could not be read as a call has no id, server or name: it is reported, not run.
            calls.append(
                ToolCall(
                    call_id=f"bad_{number}",
                    server=None,
                    name="(unreadable call)",
                    arguments=None,
                    arguments_text=str(bad.get("raw") or ""),
                    error=str(bad.get("reason") or "the call could not be read"),
                )
            )
        for call in calls:
            result = results.get(call.call_id)
            if result is not None:
                call.result = str(result.get("content") or "")
                call.is_error = bool(result.get("is_error"))
                call.structured = result.get("structured")
                call.server = call.server or result.get("server")
            call.started_at, call.duration_s = started, duration
        self.turn.tool_calls = calls
        return self.turn


def node_event(record: NodeRecord) -> NodeEvent:
    meta = record.meta.value if record.meta.ok and isinstance(record.meta.value, dict) else {}
    return NodeEvent(
        name=record.name,
        index=record.index,
        started_at=parse_time(meta.get("started_at")),
        duration_s=record.duration_s,
        status=record.status,
        error=record.error,
    )


def read_conversation(base: Path, agent: str, scope: str, call_id: str | None, *, replay: bool = False) -> Conversation:
    """A conversation's saved turns under ``base`` and, below each turn, the sub-agents it started (``replay``:
    the run replayed a saved one, whose replies it was served unbilled)."""
    conv = Conversation(agent, scope, call_id)
    turns, _notes = read_turns(base)
    for record in turns:
        builder = TurnBuilder(record.number, keep_prompt=record.number == turns[0].number, replay=replay)
        for node in record.nodes:
            if node.index is None and not (node.path / META_FILE).exists():
                continue  # a folder of nested conversations (subagents/, a compaction call), not a node
            output = read_artifact(node.path / OUTPUT_FILE) if (node.path / META_FILE).exists() else None
            value = output.value if output is not None and output.ok and isinstance(output.value, dict) else None
            builder.add(node_event(node), value)
        turn = builder.build()
        sub_root = record.path / SUBAGENTS_DIR
        if sub_root.is_dir():
            for sub in sorted(p for p in sub_root.iterdir() if p.is_dir()):
                name, _, sub_call = sub.name.rpartition("-")
                sub_scope = f"{scope}/{record.path.name}/{SUBAGENTS_DIR}/{sub.name}".lstrip("/")
                sub_conv = read_conversation(sub, name or sub.name, sub_scope, sub_call or None, replay=replay)
                turn.subagents.append(sub_conv)
        conv.turns.append(turn)
    return conv


@dataclass(frozen=True)
class TaskFolder:
    """Where one run of a task is recorded: the task's folder, or one of its epochs' folders."""

    task_id: str
    epoch: int
    folder: Path
    task_folder: Path
    epoch_folder: bool = False


def _result(folder: Path) -> TaskResult | None:
    result = read_artifact(folder / RESULT_FILE)
    return TaskResult.from_dict(result.value) if result.ok and isinstance(result.value, dict) else None


def _epoch_numbers(task_folder: Path) -> list[int]:
    epochs_dir = task_folder / EPOCHS_DIR
    if not epochs_dir.is_dir():
        return []
    return sorted(int(p.name) for p in epochs_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0)


def task_folders(run_dir: Path) -> list[TaskFolder]:
    """Every run of every task of a run, in folder order: a task folder is epoch 1, unless the task ran with
    epochs (``tasks/<id>/epochs/<n>/``): then each epoch folder is one, in epoch order."""
    tasks_dir = run_dir / TASKS_DIR
    if not tasks_dir.is_dir():
        return []
    found: list[TaskFolder] = []
    for folder in sorted(p for p in tasks_dir.iterdir() if p.is_dir()):
        numbers = _epoch_numbers(folder)
        epoch_dirs = [folder / EPOCHS_DIR / str(n) for n in numbers]
        # The id is in the task's result.json, or (the task still running its epochs) in an epoch's.
        results = (_result(f) for f in (folder, *epoch_dirs))
        task_id = next((str(r.task_id) for r in results if r is not None and r.task_id), folder.name)
        if not numbers:
            found.append(TaskFolder(task_id, 1, folder, folder))
        found.extend(TaskFolder(task_id, n, d, folder, True) for n, d in zip(numbers, epoch_dirs, strict=True))
    return found


def read_task_trace(place: TaskFolder, *, replay: bool = False) -> TaskTrace:
    result = _result(place.folder)
    timing = read_artifact(place.folder / TIMING_FILE)
    return TaskTrace(
        task_id=place.task_id,
        epoch=place.epoch,
        folder=place.folder,
        result=result,
        timing=timing.value if timing.ok and isinstance(timing.value, dict) else None,
        conversation=read_conversation(place.folder, "main", "", None, replay=replay),
        epoch_folder=place.epoch_folder,
        task_result=_result(place.task_folder) if place.epoch_folder else result,
    )


def read_run_traces(run_dir: Path, *, replay: bool = False) -> list[TaskTrace]:
    return [read_task_trace(place, replay=replay) for place in task_folders(run_dir)]
