"""What the agent loop is given and what it returns: its settings and the result of one conversation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowllm.core.interfaces import Halt
from flowllm.core.types import Usage

# Why a conversation ended (``AgentResult.stop``).
STOP_NO_TOOL_CALLS = "no_tool_calls"
STOP_MAX_TURNS = "max_turns"


@dataclass
class AgentSettings:
    max_turns: int = 10
    system_prompt: str = ""
    summary_prompt: str = "Give your final answer now, wrapped in \\boxed{}. Do not call any tool."


@dataclass
class AgentResult:
    answer: str
    final_text: str
    turns: int
    stop: str
    usage: Usage = field(default_factory=Usage)
    tool_calls: int = 0
    bad_tool_calls: int = 0
    failed_tool_calls: int = 0
    # Of the failed calls, those that failed for an infrastructure reason, by cause (core.types.InfraCause).
    infra_tool_failures: dict[str, int] = field(default_factory=dict)
    repairs: dict[str, int] = field(default_factory=dict)  # repair stage -> count ("failed" for failures)
    subagent_calls: int = 0
    vision_calls: int = 0
    sampling_calls: int = 0  # tool servers' sampling requests answered (tools.sampling=answer)
    stop_reason: str | None = None  # of the last reply
    model: str = ""  # the model the last reply names
    halt: Halt | None = None  # the gate ended the conversation (a per-task limit, the run's budget)

    def to_dict(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "turns": self.turns,
            "stop": self.stop,
            "usage": self.usage.to_dict(),
            "tool_calls": self.tool_calls,
            "bad_tool_calls": self.bad_tool_calls,
            "failed_tool_calls": self.failed_tool_calls,
            "infra_tool_failures": dict(sorted(self.infra_tool_failures.items())),
            "repairs": dict(sorted(self.repairs.items())),
            "subagent_calls": self.subagent_calls,
            "vision_calls": self.vision_calls,
            "sampling_calls": self.sampling_calls,
        }
