"""The contracts between the engine's nodes and the services injected into them.

Nodes never build providers or tool servers themselves: the experiment opens them (once per run for a provider,
once per task for a tool pool) and hands them to the turn through ``TurnContext``. These protocols are what a
node may rely on; ``flowllm.providers`` and ``flowllm.tools`` implement them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from flowllm.core.types import Block, Message, ModelResponse, ToolResult, ToolSpec

WireProtocol = Literal["anthropic", "openai_chat", "openai_responses"]
ToolProtocol = Literal["xml", "native"]


@dataclass(frozen=True)
class CallContext:
    """Who is calling the model: used for routing (the offline emulator's script), logging and usage."""

    task_id: str
    turn: int
    agent: str = "main"
    # Where this conversation is recorded under the task folder: "" for the main agent, e.g.
    # "turn_002/subagents/researcher-call_0" for a sub-agent. Unique within a task, unlike ``agent``.
    scope: str = ""


@dataclass(frozen=True)
class Halt:
    """Why a conversation ends before the model is done: ``status`` is ``limit`` (a per-task limit, named by
    ``limit``) or ``budget`` (the run's budget is spent)."""

    status: Literal["limit", "budget"]
    limit: str | None = None  # the per-task limit reached (agent.limits.<name>), for status limit
    detail: str = ""  # what was measured against what, one line


@runtime_checkable
class TurnGate(Protocol):
    """Asked by the agent loop after each turn (its model call and the tool calls it asked for): whether the
    task may go on. ``agent`` is ``main`` or a sub-agent's name; ``turns`` counts that conversation's turns,
    ``scope`` is where it is recorded (``CallContext.scope``).
    ``before_turn`` is awaited before each turn starts (a paused run waits there: ``flowllm ctl RUN pause``)."""

    async def before_turn(self) -> None: ...

    def after_turn(self, agent: str, turns: int, scope: str = "") -> Halt | None: ...


@runtime_checkable
class Provider(Protocol):
    """One configured model endpoint.

    ``build_request`` and ``normalize`` are pure; ``send`` is the only I/O. ``send`` returns the raw reply as a
    JSON-able dict: the response body for a plain call, ``{"stream": True, "events": [...]}`` for a streamed
    one, so that ``normalize`` can rebuild the reply from what was saved on disk.
    """

    name: str
    protocol: WireProtocol
    model: str
    tool_protocol: ToolProtocol
    supports_cache_control: bool
    # The media block types (image, audio, document, file) sent to the model as themselves; every other medium
    # goes as its text description (``flowllm.nodes.media``). From ``provider.accepts`` (minus "text").
    accepted_media: frozenset[str]

    def build_request(
        self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]
    ) -> dict[str, Any]: ...

    async def send(self, request: dict[str, Any], *, context: CallContext) -> dict[str, Any]: ...

    def normalize(self, raw: dict[str, Any]) -> ModelResponse: ...

    async def aclose(self) -> None: ...


class TaskStore(Protocol):
    """A task's key-value store, one namespace per tool server (``tools.task_state``; flowllm/tools/state.py):
    what a tool backend reads for a tool that asks for it, and the update the tool sends back."""

    def values(self, namespace: str) -> dict[str, Any]: ...

    def apply(self, namespace: str, update: Mapping[str, Any]) -> None: ...


@runtime_checkable
class ToolBackend(Protocol):
    """The tools one task may use (a pool of MCP servers, or anything else with the same shape)."""

    async def list_tools(self) -> list[ToolSpec]: ...

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
        """``state``: the task's key-value store, passed by dispatch when ``tools.task_state`` is on; a backend
        hands it to the tools that ask for it (or ignores it)."""
        ...

    @property
    def task_state(self) -> TaskStore | None:
        """The task's store for dispatch to pass back into ``call`` (None: this backend keeps none)."""
        ...

    @property
    def sampler(self) -> SamplingSlot | None:
        """Where the servers' sampling requests are answered (``tools.sampling=answer``); None: declined."""
        ...

    @property
    def startup_seconds(self) -> float:
        """Seconds spent starting this task's servers (0.0 when it started none)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class SamplingRequest:
    """A tool server's ``sampling/createMessage``, in flowllm's canonical blocks (``tools.sampling=answer``)."""

    server: str
    messages: list[Message]
    system_prompt: str = ""
    max_tokens: int | None = None  # what the server asked for; the provider's own max_tokens is what applies


@dataclass(frozen=True)
class SamplingReply:
    """The model's answer to a ``SamplingRequest``."""

    text: str
    model: str
    stop_reason: str | None = None  # flowllm's canonical stop reason (end_turn, max_tokens, ...)


# Answers one sampling request; raises when the model call fails (the server then gets an MCP error).
SamplingHandler = Callable[[SamplingRequest], Awaitable[SamplingReply]]


@runtime_checkable
class SamplingSlot(Protocol):
    """Where a task's tool backend takes the answer to its servers' sampling requests: the pool opens it (when
    ``tools.sampling=answer``), the agent fills it when the task's conversation starts and empties it after."""

    def bind(self, handler: SamplingHandler | None) -> None: ...
