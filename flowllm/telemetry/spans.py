"""A task's trace as OpenTelemetry spans, with the GenAI semantic conventions.

One trace per task (and epoch)::

    task <task_id> [epoch <n>]                 flowllm.task_id, flowllm.epoch, flowllm.run_dir, the outcome
      turn <n>                                  flowllm.turn, flowllm.agent, flowllm.scope
        chat <model>                            gen_ai.operation.name=chat, provider, models, usage, finish reasons
        execute_tool <name>                     gen_ai.operation.name=execute_tool, gen_ai.tool.name / call.id
          invoke_agent <sub-agent>              gen_ai.operation.name=invoke_agent (its turns below it)

Spans carry the recorded start times and durations (a tool span covers its turn's dispatch: the tools of a turn
run together and are timed together). The same spans are built live (``flowllm.telemetry.live``) and after the
fact from a saved run (``flowllm inspect export RUN --format otlp``). Message contents are not exported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowllm.export.trace import Conversation, ModelCall, TaskTrace, ToolCall, Turn

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

NS = 1_000_000_000
# gen_ai.provider.name's well-known values, by wire protocol.
PROVIDER_NAMES = {"anthropic": "anthropic", "openai_chat": "openai", "openai_responses": "openai"}
# Phoenix (OpenInference) shows a span's kind from this attribute; other receivers ignore it.
OPENINFERENCE_KIND = "openinference.span.kind"


def _ns(seconds: float | None) -> int | None:
    return int(seconds * NS) if seconds is not None else None


def _end(start: float | None, duration: float | None) -> int | None:
    return _ns(start + (duration or 0.0)) if start is not None else None


class SpanBuilder:
    """Emits the spans of one task through ``tracer``; ``run_dir`` is written on every span."""

    def __init__(self, tracer: Tracer, run_dir: str) -> None:
        self.tracer = tracer
        self.run_dir = run_dir

    def _start(self, name: str, parent: Span | None, start: float | None, attrs: dict[str, Any]) -> Span:
        from opentelemetry import trace
        from opentelemetry.context import Context

        context = trace.set_span_in_context(parent) if parent is not None else Context()
        clean = {k: v for k, v in attrs.items() if v is not None}
        return self.tracer.start_span(name, context=context, start_time=_ns(start), attributes=clean)

    @staticmethod
    def _finish(span: Span, end: int | None, error: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        if error:
            span.set_status(Status(StatusCode.ERROR, error[:500]))
        span.end(end_time=end)

    def task(self, trace: TaskTrace) -> int:
        """All spans of one task; returns how many were made."""
        conv = trace.conversation
        start = conv.started_at
        end = conv.ended_at
        result = trace.result  # None: the task has not finished
        status = result.status if result is not None else "unfinished"
        correct = trace.verdict  # None where the tallies count no verdict (a budget's stop among them)
        usage = trace.usage()
        root = self._start(
            f"task {trace.task_id}" + (f" epoch {trace.epoch}" if trace.epoch_folder else ""),
            None,
            start,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "main",
                OPENINFERENCE_KIND: "AGENT",
                "flowllm.task_id": trace.task_id,
                "flowllm.epoch": trace.epoch,
                "flowllm.run_dir": self.run_dir,
                "flowllm.status": status,
                "flowllm.correct": correct if isinstance(correct, bool) else None,
                "flowllm.scored": isinstance(correct, bool),
                "flowllm.answer": result.answer if result is not None else None,
                "flowllm.turns": result.turns if result is not None else None,
                "gen_ai.usage.input_tokens": usage.get("input_tokens"),
                "gen_ai.usage.output_tokens": usage.get("output_tokens"),
            },
        )
        count = 1 + self._conversation(trace, conv, root)
        error = result.error if result is not None else None
        self._finish(root, _ns(end), str(error) if status == "failed" and error else None)
        return count

    def _conversation(self, trace: TaskTrace, conv: Conversation, parent: Span) -> int:
        count = 0
        for turn in conv.turns:
            count += self._turn(trace, conv, turn, parent)
        return count

    def _base(self, trace: TaskTrace, conv: Conversation, turn: Turn) -> dict[str, Any]:
        return {
            "flowllm.task_id": trace.task_id,
            "flowllm.epoch": trace.epoch,
            "flowllm.run_dir": self.run_dir,
            "flowllm.turn": turn.number,
            "flowllm.agent": conv.agent,
            "flowllm.scope": conv.scope or None,
        }

    def _turn(self, trace: TaskTrace, conv: Conversation, turn: Turn, parent: Span) -> int:
        base = self._base(trace, conv, turn)
        span = self._start(f"turn {turn.number}", parent, turn.started_at, {**base, OPENINFERENCE_KIND: "CHAIN"})
        count = 1
        if turn.model is not None:
            count += self._chat(turn.model, base, span)
        by_call = {sub.call_id: sub for sub in turn.subagents}
        for call in turn.tool_calls:
            count += self._tool(trace, call, base, span, by_call.pop(call.call_id, None))
        for sub in by_call.values():  # a sub-agent whose tool call is not in the turn's records
            count += self._agent(trace, sub, span)
        self._finish(span, _ns(turn.ended_at), turn.error)
        return count

    def _chat(self, call: ModelCall, base: dict[str, Any], parent: Span) -> int:
        model = call.response_model or call.request_model or "unknown"
        usage = call.usage
        provider = PROVIDER_NAMES.get(call.protocol or "", call.provider)
        attrs = {
            **base,
            "flowllm.node": "call_model",
            OPENINFERENCE_KIND: "LLM",
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,
            "gen_ai.request.model": call.request_model,
            "gen_ai.response.model": call.response_model,
            "gen_ai.response.id": call.response_id,
            "gen_ai.response.finish_reasons": [call.stop_reason] if call.stop_reason else None,
            "gen_ai.usage.input_tokens": usage.get("input_tokens"),
            "gen_ai.usage.output_tokens": usage.get("output_tokens"),
            "gen_ai.usage.cache_read.input_tokens": usage.get("cache_read_tokens"),
            "gen_ai.usage.cache_creation.input_tokens": usage.get("cache_write_tokens"),
            "gen_ai.usage.reasoning.output_tokens": usage.get("reasoning_tokens") or None,
            "flowllm.usage.estimated": usage.get("estimated"),
            "flowllm.provider": call.provider,
            # A replay's reply served from the saved run: no call was made, so no gen_ai.usage.* is claimed.
            "flowllm.replayed": True if not call.billed else None,
            "flowllm.forked": True if call.live else None,
            "error.type": call.error.split(":", 1)[0] if call.error else None,
        }
        span = self._start(f"chat {model}", parent, call.started_at, attrs)
        self._finish(span, _end(call.started_at, call.duration_s), call.error)
        return 1

    def _tool(
        self, trace: TaskTrace, call: ToolCall, base: dict[str, Any], parent: Span, sub: Conversation | None
    ) -> int:
        problem = call.error if call.arguments is None and call.error else None
        if problem is None and call.is_error:
            problem = (call.result or "the tool reported an error")[:500]
        attrs = {
            **base,
            "flowllm.node": "dispatch_tools",
            OPENINFERENCE_KIND: "TOOL",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.call_id,
            "gen_ai.tool.type": "function",
            "flowllm.tool.server": call.server,
            "flowllm.timing": "dispatch",
            "error.type": ("bad_tool_call" if call.arguments is None and call.error else "tool_error")
            if problem
            else None,
        }
        span = self._start(f"execute_tool {call.name}", parent, call.started_at, attrs)
        count = 1
        if sub is not None:
            count += self._agent(trace, sub, span)
        self._finish(span, _end(call.started_at, call.duration_s), problem)
        return count

    def _agent(self, trace: TaskTrace, sub: Conversation, parent: Span) -> int:
        attrs = {
            "flowllm.task_id": trace.task_id,
            "flowllm.epoch": trace.epoch,
            "flowllm.run_dir": self.run_dir,
            "flowllm.scope": sub.scope,
            OPENINFERENCE_KIND: "AGENT",
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": sub.agent,
            "gen_ai.tool.call.id": sub.call_id,
        }
        span = self._start(f"invoke_agent {sub.agent}", parent, sub.started_at, attrs)
        count = 1 + self._conversation(trace, sub, span)
        self._finish(span, _ns(sub.ended_at))
        return count
