"""Tool servers' sampling requests answered by the run's provider (``tools.sampling=answer``).

The task's pool hands each request of a task-scoped server to the handler bound to its sampler
(flowllm/tools/client/sampling.py has the MCP side). The handler runs the turn graph once, as agent ``sampling`` with
the server's system prompt and no tools, so a sampling call is what a sub-agent is: recorded under the turn whose
tool call triggered it (``turn_NNN/subagents/sampling-<n>/turn_001/...``, ``n`` counting the task's sampling
calls from 1), its tokens counted toward the task and in ``usage.jsonl`` (agent ``sampling``), retried and fallen
back like any call, and served again by ``provider=replay``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from flowllm.agent.results import AgentResult
from flowllm.core.interfaces import SamplingReply, SamplingRequest
from flowllm.core.types import Message, Usage

SAMPLING_AGENT = "sampling"
# When the model's reply reads as a tool call (there are none): the one follow-up turn asks for plain text.
SAMPLING_SUMMARY_PROMPT = "No tool is available. Answer the request above now, in plain text."

# Runs one sampling conversation: (messages, system prompt, record scope) -> its result.
SamplingRunner = Callable[[list[Message], str, str], Coroutine[Any, Any, AgentResult]]


@dataclass
class SamplingCalls:
    """The handler a task binds to its pool's sampler: runs each request, adds up what they cost."""

    run_sampling: SamplingRunner
    record_dir: Callable[[int], str]  # the task's n-th sampling call (from 1) -> its conversation's scope
    model: str  # the provider's model, for a reply that names none
    usage: Usage = field(default_factory=Usage)
    calls: int = 0
    _started: int = 0

    async def __call__(self, request: SamplingRequest) -> SamplingReply:
        self._started += 1
        result = await self.run_sampling(request.messages, request.system_prompt, self.record_dir(self._started))
        self.usage = self.usage + result.usage
        self.calls += 1
        return SamplingReply(text=result.final_text, model=result.model or self.model, stop_reason=result.stop_reason)
