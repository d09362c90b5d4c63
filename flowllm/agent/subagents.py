"""Sub-agents as tools: a configured agent appears to its parent as ``agent-<name>.execute_subtask(subtask)``.

The sub-agent runs the same turn graph with its own system prompt, turn limit and tool subset, on the parent's
provider and tool pool (same task workspace). Its turns are recorded under the parent turn that called it
(``tasks/<task>/turn_NNN/subagents/<name>-<call_id>/turn_MMM/...``), and its usage counts toward the task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from flowllm.agent.results import AgentResult
from flowllm.core.forwarding import ForwardingTools
from flowllm.core.interfaces import TaskStore, ToolBackend
from flowllm.core.types import ToolResult, ToolSpec, Usage

SUBAGENT_PREFIX = "agent-"
SUBTASK_TOOL = "execute_subtask"


@dataclass(frozen=True)
class SubAgentSpec:
    """A sub-agent's settings (``subagents.<name>`` in config)."""

    name: str
    description: str
    system_prompt: str = ""
    max_turns: int = 5
    # Server names of the parent's pool the sub-agent may use; None = all of them (but no sub-agents).
    servers: tuple[str, ...] | None = None
    timeout_s: float = 600.0  # the whole conversation; the caller's per-call tool timeout does not apply

    @property
    def server(self) -> str:
        return f"{SUBAGENT_PREFIX}{self.name}"

    def tool_spec(self) -> ToolSpec:
        return {
            "server": self.server,
            "name": SUBTASK_TOOL,
            "description": (
                f"{self.description.strip()}\n"
                "Delegate a self-contained subtask to this agent. Describe the subtask completely: the agent "
                "sees nothing of your conversation. It answers with its findings."
            ),
            "input_schema": {
                "type": "object",
                "properties": {"subtask": {"type": "string", "description": "the complete subtask"}},
                "required": ["subtask"],
            },
        }


# Runs one sub-agent conversation: (spec, subtask, tools, record_dir) -> its result.
SubAgentRunner = Callable[["SubAgentSpec", str, ToolBackend | None, str], Coroutine[Any, Any, AgentResult]]


class FilteredTools(ForwardingTools):
    """The parent's pool restricted to some servers (a sub-agent's tool set)."""

    def __init__(self, inner: ToolBackend, servers: tuple[str, ...] | None) -> None:
        super().__init__(inner)
        self.servers = servers

    def _allowed(self, server: str | None) -> bool:
        return self.servers is None or server in self.servers

    async def list_tools(self) -> list[ToolSpec]:
        return [t for t in await super().list_tools() if self._allowed(t["server"])]

    async def call(
        self,
        server: str | None,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str,
        timeout_s: float,
        state: TaskStore | None = None,
    ) -> ToolResult:
        if server is not None and not self._allowed(server):
            return ToolResult(call_id, server, name, f"Error: server '{server}' is not available to this agent", True)
        return await super().call(server, name, arguments, call_id=call_id, timeout_s=timeout_s, state=state)


@dataclass
class SubAgentTools(ForwardingTools):
    """A task's tools plus its sub-agents, as one ToolBackend for the main agent."""

    inner: ToolBackend | None
    specs: dict[str, SubAgentSpec]
    run_subagent: SubAgentRunner
    record_dir: Callable[[str, str], str]  # (agent name, call id) -> folder under the task, for the recorder
    usage: Usage = field(default_factory=Usage)
    calls: int = 0

    async def list_tools(self) -> list[ToolSpec]:
        return [*await super().list_tools(), *(spec.tool_spec() for spec in self.specs.values())]

    def _spec_for(self, server: str | None, name: str) -> SubAgentSpec | None:
        if server and server.startswith(SUBAGENT_PREFIX):
            return self.specs.get(server[len(SUBAGENT_PREFIX) :])
        if name == SUBTASK_TOOL and server is None and len(self.specs) == 1:
            return next(iter(self.specs.values()))
        return None

    async def call(
        self,
        server: str | None,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str,
        timeout_s: float,
        state: TaskStore | None = None,
    ) -> ToolResult:
        spec = self._spec_for(server, name)
        if spec is None:
            if server and server.startswith(SUBAGENT_PREFIX):
                known = ", ".join(s.server for s in self.specs.values())
                return ToolResult(call_id, server, name, f"Error: unknown agent '{server}'. Agents: {known}", True)
            return await super().call(server, name, arguments, call_id=call_id, timeout_s=timeout_s, state=state)
        subtask = arguments.get("subtask")
        if name != SUBTASK_TOOL or not isinstance(subtask, str) or not subtask.strip():
            return ToolResult(
                call_id, spec.server, name, f"Error: call {spec.server}.{SUBTASK_TOOL} with a 'subtask' string", True
            )
        tools = FilteredTools(self.inner, spec.servers) if self.inner is not None else None
        try:
            async with asyncio.timeout(spec.timeout_s):
                result = await self.run_subagent(spec, subtask, tools, self.record_dir(spec.name, call_id))
        except TimeoutError:
            return ToolResult(
                call_id, spec.server, SUBTASK_TOOL, f"Error: the agent did not finish within {spec.timeout_s:g}s", True
            )
        self.usage = self.usage + result.usage
        self.calls += 1
        return ToolResult(call_id, spec.server, SUBTASK_TOOL, result.final_text.strip() or "(no answer)")
