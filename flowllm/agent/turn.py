"""The agent loop's side of a turn: what it gives every pipeline and what it reads back.

``AGENT_TURN`` is checked when the pipeline is built (``build_pipeline(contract=AGENT_TURN)``), so a pipeline
without ``dispatch_tools`` or with ``next_messages`` renamed away is refused before the first task; after each
turn the loop reads a ``TurnOutcome``, checked against the same contract, instead of string keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flowllm.core.types import ModelResponse, Usage
from flowllm.engine.contract import Port, TurnContract

# An optional turn input: the usage of the previous model call, given only to pipelines that read it (so a
# pipeline without such a node records exactly what it always did).
LAST_USAGE = "last_usage"
# Nodes besides call_model that call a model (compaction) report it under an output port of this name; the
# loop adds it to the task's usage.
MODEL_USAGE_PORT = "model_usage"

AGENT_TURN = TurnContract(
    name="agent loop",
    consumes=(
        Port("messages", list),
        Port("system", list),
        Port("tools", list),
        Port(LAST_USAGE, Usage, required=False),
    ),
    produces=(
        Port("response", ModelResponse),
        Port("next_messages", list),
        # Read when present: a pipeline that offers no tools produces none of these.
        Port("tool_calls", list, required=False),
        Port("bad_tool_calls", list, required=False),
        Port("prepared_calls", list, required=False),
        Port("tool_results", list, required=False),
    ),
)


@dataclass
class TurnOutcome:
    """What one turn handed back to the agent loop."""

    response: ModelResponse
    next_messages: list[Any]
    tool_calls: list[Any] = field(default_factory=list)
    bad_tool_calls: list[Any] = field(default_factory=list)
    prepared_calls: list[Any] = field(default_factory=list)
    tool_results: list[Any] = field(default_factory=list)
    extra_usage: Usage = field(default_factory=Usage)  # model calls of other nodes (compaction)

    @classmethod
    def from_state(cls, state: Mapping[str, Any], model_usage_keys: tuple[str, ...] = ()) -> TurnOutcome:
        read = AGENT_TURN.read(state)
        extra = Usage()
        for key in model_usage_keys:
            value = state.get(key)
            if isinstance(value, Usage):
                extra = extra + value
        return cls(**read, extra_usage=extra)

    @property
    def called_tools(self) -> bool:
        return bool(self.tool_calls or self.bad_tool_calls)
