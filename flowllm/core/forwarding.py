"""Bases for services that stand in front of another one, so that no declared capability is forgotten.

A wrapper that speaks for a provider (the resilient chain, the replay provider) or for a tool backend (a
sub-agent's filtered view, the sub-agent and vision tools) must answer every question the contract
(``flowllm.core.interfaces``) lets a node ask. These bases answer them all from the wrapped service; a
wrapper overrides only what it changes.
"""

from __future__ import annotations

from typing import Any

from flowllm.core.interfaces import Provider, SamplingSlot, TaskStore, ToolBackend, ToolProtocol, WireProtocol
from flowllm.core.types import ToolResult, ToolSpec


class ProviderFacade:
    """A ``Provider`` whose identity and capabilities are those of ``head`` (the provider that answers by
    default). Subclasses implement ``build_request``, ``send``, ``normalize`` and ``aclose``."""

    name: str
    protocol: WireProtocol
    model: str
    tool_protocol: ToolProtocol
    supports_cache_control: bool
    accepted_media: frozenset[str]

    def adopt(self, head: Provider, *, name: str | None = None) -> None:
        """Take every declared attribute of the ``Provider`` contract from ``head`` (``name`` may differ)."""
        self.name = head.name if name is None else name
        self.protocol = head.protocol
        self.model = head.model
        self.tool_protocol = head.tool_protocol
        self.supports_cache_control = head.supports_cache_control
        self.accepted_media = frozenset(head.accepted_media)


class ToolBackendDefaults:
    """What a ``ToolBackend`` that keeps no task state, answers no sampling and starts no server declares."""

    @property
    def task_state(self) -> TaskStore | None:
        return None

    @property
    def sampler(self) -> SamplingSlot | None:
        return None

    @property
    def startup_seconds(self) -> float:
        return 0.0

    async def aclose(self) -> None:
        return None


class ForwardingTools(ToolBackendDefaults):
    """A ``ToolBackend`` in front of ``inner`` (or of nothing): every capability is ``inner``'s; the tools and
    calls go to it unless a subclass takes some itself. Closing it does not close ``inner``, which its opener
    owns."""

    def __init__(self, inner: ToolBackend | None) -> None:
        self.inner = inner

    @property
    def task_state(self) -> TaskStore | None:
        return self.inner.task_state if self.inner is not None else None

    @property
    def sampler(self) -> SamplingSlot | None:
        return self.inner.sampler if self.inner is not None else None

    @property
    def startup_seconds(self) -> float:
        return self.inner.startup_seconds if self.inner is not None else 0.0

    async def list_tools(self) -> list[ToolSpec]:
        return await self.inner.list_tools() if self.inner is not None else []

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
        if self.inner is None:
            return ToolResult(call_id, server, name, "Error: no tools are available", True)
        return await self.inner.call(server, name, arguments, call_id=call_id, timeout_s=timeout_s, state=state)
