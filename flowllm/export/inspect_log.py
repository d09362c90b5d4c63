"""A run as an Inspect AI eval log (``.eval``), written with inspect_ai's own log classes.

The eval: task (the experiment), model (``provider/model``), config, stats (time, usage per model). One sample
per task and epoch: the question as input, the ground truth as target, the message history rebuilt from the
recorded turns (system, user, assistant with its tool calls, tool results), the score (``C``/``I``; none for an
unscored task) with the scorer's explanation, the task's usage and billed cost, and a model event per model call
and a tool event per tool call with their times. Sub-agents' calls are events with the sub-agent as ``role``.

inspect_ai is an optional extra (``pip install "flowllm[inspect]"``); without it ``ExportError`` says so.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from flowllm import __version__
from flowllm.export.contamination import audit_run
from flowllm.export.ledger import Bills, ModelBills, model_bills, read_ledger
from flowllm.export.source import ExportError, RunSource, write_atomically
from flowllm.export.trace import Conversation, ModelCall, TaskTrace, Turn
from flowllm.rundir.results import LedgerLine, RunSummary

if TYPE_CHECKING:
    from inspect_ai.event import Event
    from inspect_ai.log import EvalLog, EvalSample, EvalSpec
    from inspect_ai.model import ChatMessage, ModelUsage

INSTALL = 'pip install "flowllm[inspect]"'
# flowllm's canonical stop reasons -> Inspect's.
STOP_REASONS = {
    "end_turn": "stop",
    "stop": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "tool_calls": "tool_calls",
    "max_tokens": "max_tokens",
    "length": "max_tokens",
    "model_context_window_exceeded": "model_length",
    "refusal": "content_filter",
    "content_filter": "content_filter",
}
CORRECT, INCORRECT = "C", "I"
# The run's settings shown as the eval's task arguments (the whole config stays in the run's .hydra/config.yaml).
SETTINGS = (
    "provider.name",
    "provider.protocol",
    "provider.tool_protocol",
    "agent.max_turns",
    "runner.name",
    "repair.name",
    "dataset.path",
    "dataset.scorer",
    "experiment.attempts",
)


def require_inspect() -> None:
    if importlib.util.find_spec("inspect_ai") is None:
        raise ExportError(f"the Inspect AI export needs inspect_ai: {INSTALL}")


def _when(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds is not None else None


def _iso(seconds: float | None) -> str | None:
    when = _when(seconds)
    return when.isoformat() if when is not None else None


def _text_of(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        return ""
    return "\n".join(str(b.get("text") or "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")


def _usage(values: dict[str, Any], cost: float | None = None) -> ModelUsage:
    from inspect_ai.model import ModelUsage

    inp, out = int(values.get("input_tokens") or 0), int(values.get("output_tokens") or 0)
    return ModelUsage(
        input_tokens=inp,
        output_tokens=out,
        total_tokens=inp + out,
        input_tokens_cache_read=values.get("cache_read_tokens"),
        input_tokens_cache_write=values.get("cache_write_tokens"),
        reasoning_tokens=values.get("reasoning_tokens"),
        total_cost=cost,
    )


class SampleBuilder:
    """One task's sample: messages and events, in the order the turns ran."""

    def __init__(self, source: RunSource, model: str, bills: ModelBills) -> None:
        self.source = source
        self.model = model
        self.bills = bills
        self.replay = source.replay

    def _assistant(self, turn: Turn) -> ChatMessage:
        from inspect_ai.model import ChatMessageAssistant
        from inspect_ai.tool import ToolCall

        model = turn.model
        assert model is not None
        calls = [
            ToolCall(
                id=c.call_id,
                function=c.name,
                arguments=c.arguments if c.arguments is not None else {},
                parse_error=c.error if c.arguments is None else None,
            )
            for c in turn.tool_calls
        ]
        return ChatMessageAssistant(
            content=model.text, tool_calls=calls or None, model=model.response_model, source="generate"
        )

    def _tool_messages(self, turn: Turn) -> list[ChatMessage]:
        from inspect_ai.model import ChatMessageTool
        from inspect_ai.tool import ToolCallError

        messages: list[ChatMessage] = []
        for call in turn.tool_calls:
            problem = call.error if call.arguments is None else (call.result if call.is_error else None)
            messages.append(
                ChatMessageTool(
                    content=call.result if call.result is not None else (call.error or ""),
                    tool_call_id=call.call_id,
                    function=call.name,
                    error=ToolCallError("parsing" if call.arguments is None else "unknown", problem or "")
                    if problem
                    else None,
                )
            )
        return messages

    def _conversation(
        self, conv: Conversation, history: list[ChatMessage], events: list[Event], t0: float
    ) -> list[ChatMessage]:
        """Appends the conversation's messages to ``history`` and its events to ``events``; returns history."""
        from inspect_ai.event import ModelEvent, ToolEvent
        from inspect_ai.model import ChatCompletionChoice, GenerateConfig, ModelOutput
        from inspect_ai.tool import ToolCallError

        for turn in conv.turns:
            call = turn.model
            if call is not None and call.error is None and call.response_model is not None:
                assistant = self._assistant(turn)
                output = ModelOutput(
                    model=call.response_model or self.model,
                    choices=[
                        ChatCompletionChoice(
                            message=assistant,  # type: ignore[arg-type]
                            stop_reason=STOP_REASONS.get(call.stop_reason or "", "unknown"),  # type: ignore[arg-type]
                        )
                    ],
                    usage=_usage(call.usage) if call.billed else None,  # a replayed reply was billed before
                    time=call.duration_s,
                    response_id=call.response_id,
                )
            else:
                assistant = None
                output = ModelOutput(
                    model=(call.request_model if call else None) or self.model, error=call.error if call else None
                )
            if call is not None:
                started = _when(call.started_at)
                events.append(
                    ModelEvent(
                        timestamp=started or datetime.now(UTC),
                        working_start=(call.started_at - t0) if call.started_at is not None else 0.0,
                        completed=_when((call.started_at or 0.0) + (call.duration_s or 0.0)) if started else None,
                        working_time=call.duration_s,
                        model=call.response_model or call.request_model or self.model,
                        requested_model=call.request_model,
                        role=None if conv.agent == "main" else conv.agent,
                        input=list(history),
                        tools=[],
                        tool_choice="auto",
                        config=GenerateConfig(),
                        output=output,
                        error=call.error,
                        metadata={"turn": turn.number, "scope": conv.scope, "provider": call.provider},
                    )
                )
            if assistant is not None:
                history.append(assistant)
            for index, tool in enumerate(turn.tool_calls):
                started = _when(tool.started_at)
                problem = tool.error if tool.arguments is None else (tool.result if tool.is_error else None)
                sub_events: list[Event] = []
                subagent = next((s for s in turn.subagents if s.call_id == tool.call_id), None)
                if subagent is not None:
                    self._conversation(subagent, [], sub_events, t0)
                events.append(
                    ToolEvent(
                        timestamp=started or datetime.now(UTC),
                        working_start=(tool.started_at - t0) if tool.started_at is not None else 0.0,
                        completed=_when((tool.started_at or 0.0) + (tool.duration_s or 0.0)) if started else None,
                        working_time=tool.duration_s,
                        id=tool.call_id,
                        function=tool.name,
                        arguments=tool.arguments or {},
                        result=tool.result or "",
                        error=ToolCallError("parsing" if tool.arguments is None else "unknown", problem)
                        if problem
                        else None,
                        events=sub_events,
                        agent=subagent.agent if subagent is not None else None,
                        metadata={"turn": turn.number, "server": tool.server, "index": index},
                    )
                )
            history.extend(self._tool_messages(turn))
        return history

    def sample(self, trace: TaskTrace) -> EvalSample:
        from inspect_ai.log import EvalError, EvalSample
        from inspect_ai.model import ChatMessageSystem, ChatMessageUser, ModelOutput
        from inspect_ai.scorer import Score

        first = trace.conversation.turns[0] if trace.conversation.turns else None
        system = _text_of(first.system) if first is not None and first.system else ""
        user_messages = [m for m in (first.prompt_messages or []) if isinstance(m, dict)] if first else []
        question = _text_of(user_messages[0].get("content")) if user_messages else ""
        history: list[ChatMessage] = []
        if system:
            history.append(ChatMessageSystem(content=system))
        history.append(ChatMessageUser(content=question))
        t0 = trace.conversation.started_at or 0.0
        events: list[Event] = []
        self._conversation(trace.conversation, history, events, t0)
        last = next((t.model for t in reversed(trace.conversation.turns) if t.model and t.model.response_model), None)
        output = ModelOutput.from_content(last.response_model or self.model, last.text) if last else ModelOutput()
        correct = trace.verdict
        scores: dict[str, Score] = {}
        if isinstance(correct, bool):
            scores[self.scorer] = Score(
                value=CORRECT if correct else INCORRECT,
                answer=trace.saved.answer,
                explanation=self._explanation(trace),
                metadata={"verdict": trace.saved.verdict, "judge": trace.saved.judge},
            )
        error = trace.saved.error
        status = trace.saved.status
        wall = (trace.timing or {}).get("wall_seconds")
        return EvalSample(
            id=trace.task_id,
            epoch=trace.epoch,
            input=question,
            target=str(trace.saved.ground_truth or ""),
            messages=history,
            output=output,
            scores=scores or None,
            metadata={
                "level": trace.saved.level,
                "status": status,
                "stop": trace.saved.stop,
                "turns": trace.saved.turns,
                "categories": trace.saved.categories or {},
                "scored": isinstance(correct, bool),
            },
            events=events,
            model_usage=self._model_usage(trace),
            started_at=_iso(trace.conversation.started_at),
            completed_at=_iso(trace.conversation.ended_at),
            total_time=float(wall) if isinstance(wall, (int, float)) else None,
            working_time=float(wall) if isinstance(wall, (int, float)) else None,
            uuid=uuid.uuid5(uuid.NAMESPACE_URL, f"{self.source.path}/{trace.task_id}/{trace.epoch}").hex,
            error=EvalError(message=str(error), traceback=str(error), traceback_ansi=str(error))
            if status == "failed" and error
            else None,
            turn_count=trace.saved.turns,
        )

    def _model_usage(self, trace: TaskTrace) -> dict[str, ModelUsage]:
        """What each model billed for the task (its epoch), tokens and cost from the same ledger lines: in a replay
        or a fork, only the calls made live (a reply served from the saved run processed no token). A task the
        ledger cannot tell apart (a ledger older than its lines' epoch) has its answer's tokens, at a cost not
        known."""
        bills = self.bills.of(trace.task_id, trace.ledger_epoch, replay=self.replay)
        if bills:
            return _model_usages(bills)
        if bills is not None:
            return {self.model: _usage({}, 0.0)}  # a replay's task with no line: nothing billed
        usage = trace.saved.usage
        return {self.model: _usage(usage, None)} if usage else {}

    @property
    def scorer(self) -> str:
        return str(self.source.setting("dataset.scorer") or "flowllm")

    @staticmethod
    def _explanation(trace: TaskTrace) -> str:
        lines = [f"answer {trace.saved.answer!r}, ground truth {trace.saved.ground_truth!r}"]
        for key in ("verdict", "judge", "score_error"):
            value = getattr(trace.saved, key)
            if value:
                lines.append(f"{key}: {value if isinstance(value, str) else orjson.dumps(value).decode()}")
        return "\n".join(lines)


def _model_usages(bills: Bills) -> dict[str, ModelUsage]:
    return {model: _usage(bill.usage.to_dict(), bill.cost_usd) for model, bill in sorted(bills.items())}


def _share_correct(scored: list[TaskTrace]) -> float | None:
    return sum(1 for t in scored if t.verdict is True) / len(scored) if scored else None


@dataclass(frozen=True)
class EpochPlan:
    """The run's tasks and epochs as Inspect counts them: one sample per task and epoch, the eval's accuracy
    over the tasks' reduced scores (``experiment.epoch_reducer``), as flowllm's own summary has it."""

    task_ids: list[str]
    epochs: int
    epochs_run: bool
    reducer: str

    @classmethod
    def of(cls, source: RunSource) -> EpochPlan:
        ids = list(dict.fromkeys(t.task_id for t in source.traces))
        epochs_run = any(t.epoch_folder for t in source.traces)
        configured = source.setting("experiment.epochs")
        seen = max((t.epoch for t in source.traces), default=1)
        epochs = max(configured, seen) if isinstance(configured, int) and epochs_run else seen
        # As the tasks' result.json name it (the saved config may spell the enum's name: MEAN).
        named = next((t.task_result.epoch_reducer for t in source.traces if t.task_result is not None), None)
        reducer = str(named or source.setting("experiment.epoch_reducer") or "mean").lower()
        return cls(ids, epochs, epochs_run, reducer)

    def accuracy(self, source: RunSource) -> float | None:
        """The mean of the finished tasks' reduced scores (None: no task has one yet)."""
        results = {t.task_id: t.task_result for t in source.traces if t.task_result is not None}
        scores = [float(r.score) for r in results.values() if isinstance(r.score, (int, float))]
        return sum(scores) / len(scores) if scores else None


def eval_model(source: RunSource) -> str:
    """The eval's ``provider/model``: the run's; for a fork, the live provider's model that answered its forked
    calls (a fork's own provider is ``replay``, which names no model), or the run's when none forked."""
    if source.replay:
        for trace in source.finished:
            live = next((c for c in _calls(trace.conversation) if c.live), None)
            if live is not None:
                return f"{live.provider or source.setting('provider.live') or 'live'}/{live.request_model}"
    return f"{source.provider}/{source.model}"


def _calls(conv: Conversation) -> Iterator[ModelCall]:
    for turn in conv.turns:
        if turn.model is not None:
            yield turn.model
        for sub in turn.subagents:
            yield from _calls(sub)


def _agent_ledger(source: RunSource) -> list[LedgerLine]:
    """The agent's ledger lines, the run's own provider under the eval's name for it: the ledger names a provider
    by its config's ``name`` (``provider=offline_chat``'s is ``offline``). The judge's lines keep theirs."""
    lines = read_ledger(source.ledger)
    name = source.setting("provider.name")
    if source.replay or not name or name == source.provider:
        return lines
    return [replace(line, provider=source.provider) if line.provider == name else line for line in lines]


def _run_usage(bills: ModelBills, totals: dict[str, Any], model: str, replay: bool) -> dict[str, ModelUsage]:
    """Every model's bill over the run (the judge's too); with no ledger, the answers' tokens at a cost not known
    (nothing billed in a replay)."""
    if bills.run:
        return _model_usages(bills.run)
    if replay:
        return {model: _usage({}, 0.0)}
    return {model: _usage(totals, None)} if totals else {}


def _usage_totals(traces: list[TaskTrace]) -> dict[str, Any]:
    """The integer usage counts of the tasks' answers, summed by key."""
    totals: dict[str, Any] = {}
    for t in traces:
        usage = t.saved.usage
        if isinstance(usage, dict):
            for key, value in usage.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    totals[key] = totals.get(key, 0) + value
    return totals


def _eval_spec(source: RunSource, model: str, plan: EpochPlan, created: datetime) -> EvalSpec:
    """What was evaluated: the experiment, dataset, model and its settings, and the run it came from."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalSpec
    from inspect_ai.model import GenerateConfig

    summary = source.summary or RunSummary.from_dict({})
    return EvalSpec(
        created=created.isoformat(),
        task=str(summary.experiment or source.setting("experiment.name") or "flowllm"),
        task_id=uuid.uuid5(uuid.NAMESPACE_URL, str(source.path)).hex,
        run_id=uuid.uuid5(uuid.NAMESPACE_URL, f"run:{source.path}").hex,
        dataset=EvalDataset(
            name=str(source.setting("dataset.path") or summary.dataset or ""),
            location=str(source.setting("dataset.path") or ""),
            samples=len(plan.task_ids),
            sample_ids=plan.task_ids,
        ),
        model=model,
        model_generate_config=GenerateConfig(
            max_tokens=source.setting("provider.max_tokens"), temperature=source.setting("provider.temperature")
        ),
        model_base_url=source.setting("provider.base_url"),
        task_args={key: source.setting(key) for key in SETTINGS if source.setting(key) is not None},
        config=EvalConfig(epochs=plan.epochs, epochs_reducer=[plan.reducer] if plan.epochs_run else None),
        packages={"flowllm": __version__},
        metadata={
            "flowllm_run": str(source.path),
            "overrides": source.overrides,
            "runner": summary.runner,
            "repair": summary.repair,
            "provider": source.provider,
            "unfinished_tasks": [
                f"{t.task_id} (epoch {t.epoch})" if t.epoch_folder else t.task_id for t in source.unfinished
            ],
            # The guard's blocks, the flagged tasks and the accuracy without them (a run older than the block:
            # audited now, flowllm/export/contamination.py).
            "contamination": (summary.contamination or audit_run(source.path).block()).to_dict(),
        },
    )


def build_eval_log(source: RunSource) -> EvalLog:
    require_inspect()
    from inspect_ai.log import EvalLog, EvalMetric, EvalResults, EvalScore, EvalStats

    model = eval_model(source)
    bills = model_bills(_agent_ledger(source), read_ledger(source.judge_ledger))
    builder = SampleBuilder(source, model, bills)
    traces = source.finished
    samples = [builder.sample(t) for t in traces]
    scored = [t for t in traces if t.verdict is not None]
    summary = source.summary or RunSummary.from_dict({})
    plan = EpochPlan.of(source)
    accuracy = plan.accuracy(source) if plan.epochs_run else _share_correct(scored)
    metrics = {"accuracy": EvalMetric(name="accuracy", value=accuracy)} if accuracy is not None else {}
    starts = [t.conversation.started_at for t in traces if t.conversation.started_at is not None]
    ends = [t.conversation.ended_at for t in traces if t.conversation.ended_at is not None]
    totals = _usage_totals(traces)
    status: Literal["started", "success", "cancelled"] = (
        "success" if summary.status == "finished" and not source.unfinished else "started"
    )
    if summary.interrupted:
        status = "cancelled"
    created = _when(min(starts)) if starts else datetime.now(UTC)
    assert created is not None
    spec = _eval_spec(source, model, plan, created)
    results = EvalResults(
        total_samples=len(plan.task_ids) * plan.epochs if plan.epochs_run else len(source.traces),
        completed_samples=len(samples),
        scores=[
            EvalScore(
                name=builder.scorer,
                scorer=builder.scorer,
                reducer=plan.reducer if plan.epochs_run else None,
                scored_samples=len(scored),
                unscored_samples=len(traces) - len(scored),
                metrics=metrics,
            )
        ],
    )
    stats = EvalStats(
        started_at=created.isoformat(),
        completed_at=(_when(max(ends)) or created).isoformat() if ends else "",
        model_usage=_run_usage(bills, totals, model, source.replay),
    )
    return EvalLog(status=status, eval=spec, results=results, stats=stats, samples=samples)


def write_eval_log(source: RunSource, path: Path) -> int:
    """Writes the log to ``path`` (a ``.eval`` file) at once or not at all; returns the number of samples."""
    if path.suffix not in (".eval", ".json"):
        raise ExportError(f"{path}: an Inspect AI log is a .eval file (or .json)")
    log = build_eval_log(source)
    from inspect_ai.log import write_eval_log as inspect_write

    write_atomically(path, lambda tmp: inspect_write(log, str(tmp)))
    return len(log.samples or [])
