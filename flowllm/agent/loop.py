"""The agent loop: run the turn graph until the model calls no tool, or the turn limit (then a summary turn)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flowllm.agent.answer import extract_answer
from flowllm.agent.results import STOP_MAX_TURNS, STOP_NO_TOOL_CALLS, AgentResult, AgentSettings
from flowllm.agent.sampling import SAMPLING_AGENT, SAMPLING_SUMMARY_PROMPT, SamplingCalls
from flowllm.agent.subagents import SubAgentSpec, SubAgentTools
from flowllm.agent.turn import AGENT_TURN, LAST_USAGE, MODEL_USAGE_PORT, TurnOutcome
from flowllm.agent.vision import VISION_AGENT, VisionSpec, VisionTools
from flowllm.core.interfaces import Halt, Provider, SamplingSlot, ToolBackend, TurnGate
from flowllm.core.types import Block, Message, ModelResponse, ToolSpec, Usage, text_block, user_message
from flowllm.engine import Pipeline, Runner, TurnContext
from flowllm.engine.runners import NodeObserver
from flowllm.rundir.layout import subagent_scope
from flowllm.tools.client.textproto import describe_server_instructions, describe_tools_for_prompt


def build_system_prompt(base: str, tools: list[ToolSpec], tool_protocol: str) -> list[Block]:
    """The system prompt as blocks: the configured text, plus the tool manual for the text protocol."""
    parts = [base.strip()] if base.strip() else []
    if tools and tool_protocol == "xml":
        parts.append(describe_tools_for_prompt(tools))
    elif tools and describe_server_instructions(tools):  # native: the schemas go in the request, not these
        parts.append(describe_server_instructions(tools))
    return [text_block("\n\n".join(parts))] if parts else []


def sampling_slot(tools: ToolBackend | None) -> SamplingSlot | None:
    """The sampler of a task's tool pool, when it answers its servers' sampling requests (tools.sampling=answer)."""
    return tools.sampler if tools is not None else None


def append_user_text(messages: list[Message], text: str) -> list[Message]:
    """Add a user instruction; joined to a trailing user message so roles keep alternating."""
    if messages and messages[-1]["role"] == "user":
        last = messages[-1]
        merged: Message = {**last, "content": [*last["content"], text_block(text)]}
        return [*messages[:-1], merged]
    return [*messages, user_message(text)]


@dataclass
class _CurrentTurn:
    """The main conversation's turn now running: where a sub-agent's, vision or sampling call is recorded."""

    number: int = 0

    def set(self, turn: int) -> None:
        self.number = turn


@dataclass
class _Tally:
    """What one conversation's turns add up to: tokens, tool calls, repairs, infrastructure failures, the last
    reply."""

    usage: Usage = field(default_factory=Usage)
    counts: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    infra: Counter[str] = field(default_factory=Counter)
    response: ModelResponse | None = None

    def add(self, outcome: TurnOutcome) -> TurnOutcome:
        self.response = outcome.response
        self.usage = self.usage + outcome.response.usage + outcome.extra_usage
        self.counts["calls"] += len(outcome.prepared_calls)
        self.counts["bad"] += len(outcome.bad_tool_calls)
        self.counts["failed"] += sum(1 for r in outcome.tool_results if r.is_error)
        self.infra.update(r.infra.value for r in outcome.tool_results if r.is_error and r.infra is not None)
        for p in outcome.prepared_calls:
            self.repairs[p.repair_stage or "failed"] += 1
        return outcome

    def result(self, *, turns: int, stop: str, halt: Halt | None) -> AgentResult:
        response = self.response
        assert response is not None
        return AgentResult(
            answer=extract_answer(response.text),
            final_text=response.text,
            turns=turns,
            stop=stop,
            usage=self.usage,
            tool_calls=self.counts["calls"],
            bad_tool_calls=self.counts["bad"],
            failed_tool_calls=self.counts["failed"],
            infra_tool_failures=dict(self.infra),
            repairs=dict(self.repairs),
            stop_reason=response.stop_reason,
            model=response.model,
            halt=halt,
        )


class Agent:
    """Runs one task's conversation through a validated pipeline with a given runner."""

    def __init__(
        self,
        pipeline: Pipeline,
        runner: Runner,
        settings: AgentSettings,
        observer: NodeObserver | None = None,
        subagents: dict[str, SubAgentSpec] | None = None,
        vision: VisionSpec | None = None,
    ) -> None:
        # agent.max_turns and each sub-agent's are checked where the config is read (flowllm/setup/settings.py).
        if pipeline.contract is not AGENT_TURN:
            AGENT_TURN.check(pipeline.nodes, pipeline.source)
        self.pipeline = pipeline
        self.runner = runner
        self.settings = settings
        self.observer = observer
        self.subagents = dict(subagents or {})
        self.vision = vision
        self.wants_last_usage = any(LAST_USAGE in n.consumes for n in pipeline.nodes)
        self.model_usage_keys = tuple(
            n.output_key(MODEL_USAGE_PORT) for n in pipeline.nodes if MODEL_USAGE_PORT in n.ports.outputs
        )

    async def run(
        self,
        task_id: str,
        prompt: str,
        provider: Provider,
        tools: ToolBackend | None,
        *,
        workspace: Path | None = None,
        gate: TurnGate | None = None,
    ) -> AgentResult:
        """Run the main agent on a task; its sub-agents and the vision tool (when configured) are offered as
        tools, and the servers' sampling requests are answered while it runs (when the pool has a sampler).
        ``workspace``: the task's folder, where ``ask_image`` finds image files. ``gate``: asked after every
        turn of every conversation of the task whether it may go on (per-task limits, the run's budget)."""
        sampler = sampling_slot(tools)
        if not self.subagents and (self.vision is None or workspace is None) and sampler is None:
            return await self._converse(task_id, prompt, provider, tools, self.settings, gate=gate)
        clock = _CurrentTurn()
        subagents = self._subagent_tools(task_id, provider, tools, clock, gate) if self.subagents else None
        backend: ToolBackend | None = subagents if subagents is not None else tools
        vision = self._vision_tools(task_id, provider, backend, workspace, clock) if workspace is not None else None
        backend = vision if vision is not None else backend
        sampling = self._sampling_calls(task_id, provider, clock) if sampler is not None else None
        if sampler is not None:
            sampler.bind(sampling)
        try:
            result = await self._converse(
                task_id, prompt, provider, backend, self.settings, on_turn=clock.set, gate=gate
            )
        finally:
            if sampler is not None:
                sampler.bind(None)  # a request that arrives after the conversation is declined
        # Sub-agents', the vision model's and the servers' sampling tokens are the task's tokens.
        if subagents is not None:
            result.usage = result.usage + subagents.usage
            result.subagent_calls = subagents.calls
        if vision is not None:
            result.usage = result.usage + vision.usage
            result.vision_calls = vision.calls
        if sampling is not None:
            result.usage = result.usage + sampling.usage
            result.sampling_calls = sampling.calls
        return result

    def _subagent_tools(
        self, task_id: str, provider: Provider, tools: ToolBackend | None, clock: _CurrentTurn, gate: TurnGate | None
    ) -> SubAgentTools:
        """The sub-agents offered as tools over ``tools``; each runs its own conversation of the task."""

        async def run_subagent(
            spec: SubAgentSpec, subtask: str, sub_tools: ToolBackend | None, scope: str
        ) -> AgentResult:
            settings = AgentSettings(
                max_turns=spec.max_turns, system_prompt=spec.system_prompt, summary_prompt=self.settings.summary_prompt
            )
            return await self._converse(
                task_id, subtask, provider, sub_tools, settings, agent=spec.name, scope=scope, gate=gate
            )

        return SubAgentTools(
            tools,
            self.subagents,
            run_subagent,
            record_dir=lambda name, call_id: subagent_scope(clock.number, name, call_id),
        )

    def _vision_tools(
        self, task_id: str, provider: Provider, tools: ToolBackend | None, workspace: Path, clock: _CurrentTurn
    ) -> VisionTools | None:
        """``ask_image`` over ``tools`` when the vision tool is configured (None when it is not)."""
        if self.vision is None:
            return None
        spec = self.vision
        settings = AgentSettings(
            max_turns=1, system_prompt=spec.system_prompt, summary_prompt=self.settings.summary_prompt
        )

        async def run_vision(blocks: list[Block], scope: str) -> AgentResult:
            model = spec.provider if spec.provider is not None else provider
            return await self._converse(task_id, blocks, model, None, settings, agent=VISION_AGENT, scope=scope)

        return VisionTools(
            tools,
            spec,
            workspace,
            run_vision,
            record_dir=lambda call_id: subagent_scope(clock.number, VISION_AGENT, call_id),
        )

    def _sampling_calls(self, task_id: str, provider: Provider, clock: _CurrentTurn) -> SamplingCalls:
        """The model calls that answer the tool servers' sampling requests, one conversation each."""
        sampling_settings = AgentSettings(max_turns=1, summary_prompt=SAMPLING_SUMMARY_PROMPT)

        async def run_sampling(conversation: list[Message], system_prompt: str, scope: str) -> AgentResult:
            settings = replace(sampling_settings, system_prompt=system_prompt)
            return await self._converse(
                task_id, "", provider, None, settings, agent=SAMPLING_AGENT, scope=scope, conversation=conversation
            )

        return SamplingCalls(
            run_sampling,
            record_dir=lambda n: subagent_scope(clock.number, SAMPLING_AGENT, str(n)),
            model=provider.model,
        )

    async def _converse(
        self,
        task_id: str,
        prompt: str | list[Block],
        provider: Provider,
        tools: ToolBackend | None,
        settings: AgentSettings,
        *,
        agent: str = "main",
        scope: str = "",
        on_turn: Callable[[int], None] | None = None,
        conversation: list[Message] | None = None,
        gate: TurnGate | None = None,
    ) -> AgentResult:
        """``conversation``: the messages to start from, instead of one user message holding ``prompt``."""
        specs = await tools.list_tools() if tools is not None else []
        system = build_system_prompt(settings.system_prompt, specs, provider.tool_protocol)
        messages: list[Message]
        if conversation is not None:
            messages = list(conversation)
        elif isinstance(prompt, str):
            messages = [user_message(prompt)]
        else:
            messages = [{"role": "user", "content": list(prompt)}]
        tally = _Tally()

        async def turn(number: int, history: list[Message], backend: ToolBackend | None) -> TurnOutcome:
            if gate is not None:
                await gate.before_turn()  # a paused run starts no turn (flowllm ctl RUN pause)
            if on_turn is not None:
                on_turn(number)
            ctx = TurnContext(task_id=task_id, turn=number, provider=provider, tools=backend, agent=agent, scope=scope)
            # The summary turn (no backend) offers no tools: a forced tool_choice would make the model call one.
            offered = specs if backend is not None else []
            inputs: dict[str, Any] = {"messages": history, "system": system, "tools": offered}
            if self.wants_last_usage and tally.response is not None:
                inputs[LAST_USAGE] = tally.response.usage
            state = await self.runner.run(self.pipeline, inputs, ctx, self.observer)
            return tally.add(TurnOutcome.from_state(state, self.model_usage_keys))

        stop = STOP_MAX_TURNS
        number = 0
        halt: Halt | None = None
        for number in range(1, settings.max_turns + 1):
            outcome = await turn(number, messages, tools)
            messages = outcome.next_messages
            if not outcome.called_tools:
                stop = STOP_NO_TOOL_CALLS
                break
            halt = gate.after_turn(agent, number, scope) if gate is not None else None
            if halt is not None:  # a limit or the budget: no further model call, not even the summary turn
                stop = halt.status
                break
        else:
            # Out of turns: one more turn, without tools, that asks for the final answer.
            messages = append_user_text(messages, settings.summary_prompt)
            number += 1
            await turn(number, messages, None)

        return tally.result(turns=number, stop=stop, halt=halt)
