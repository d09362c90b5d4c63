"""What a pipeline must consume from its caller and produce for it, checked when the pipeline is built.

A node declares its own inputs and outputs (flowllm/engine/node.py); a pipeline as a whole has a caller too,
the agent loop, which supplies some state keys at the start of every turn and reads others at its end. A
``TurnContract`` writes both sides down with their types, so a pipeline that cannot serve its caller (a
removed ``dispatch_tools``, an output renamed away) is refused before the first task with one line, and the
caller reads a checked outcome instead of string keys it hopes are there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowllm.engine.errors import NodeContractError, PipelineError

if TYPE_CHECKING:
    from flowllm.engine.node import BoundNode


@dataclass(frozen=True)
class Port:
    """One state key on the caller's side of the contract."""

    name: str
    type: type | tuple[type, ...]
    required: bool = True

    @property
    def type_name(self) -> str:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        return " | ".join(t.__name__ for t in types)


@dataclass(frozen=True)
class TurnContract:
    """``consumes``: the keys the caller provides every turn; ``produces``: the keys it reads after the turn."""

    name: str
    consumes: tuple[Port, ...]
    produces: tuple[Port, ...]

    @property
    def provided(self) -> tuple[str, ...]:
        """The keys every turn starts with (optional ones are given only to pipelines that read them)."""
        return tuple(p.name for p in self.consumes if p.required)

    def check(self, nodes: list[BoundNode], source: str) -> None:
        """Refuse, with one line, a pipeline that does not produce what the caller reads, or produces it with a
        declared type the caller cannot use."""
        producers: dict[str, tuple[BoundNode, str]] = {}
        for node in nodes:
            for port in node.ports.outputs:
                producers[node.output_key(port)] = (node, port)
        for want in self.produces:
            found = producers.get(want.name)
            if found is None:
                if want.required:
                    raise PipelineError(
                        f"the {self.name} reads '{want.name}' ({want.type_name}) after every turn, but no node "
                        f"produces it. Keep the node that produces it, or rename an output to it with "
                        f"'outputs: {{port: {want.name}}}'.",
                        source=source,
                    )
                continue
            node, port = found
            declared = declared_output_type(node.node, port)
            if declared is not None and not _compatible(declared, want.type):
                raise PipelineError(
                    f"produces '{want.name}' as {declared.__name__}, but the {self.name} needs {want.type_name}",
                    node=node.name,
                    source=source,
                )

    def read(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The produced keys of a finished turn, type-checked; an absent optional key is left out."""
        out: dict[str, Any] = {}
        for want in self.produces:
            if want.name not in state:
                if want.required:
                    raise NodeContractError(f"the turn ended without '{want.name}', which the {self.name} reads")
                continue
            value = state[want.name]
            if not isinstance(value, want.type):
                raise NodeContractError(
                    f"the turn produced '{want.name}' as {type(value).__name__}, but the {self.name} needs "
                    f"{want.type_name}"
                )
            out[want.name] = value
        return out


def declared_output_type(node: object, port: str) -> type | None:
    """The type a node declares for one of its outputs (``output_types``), if it declares one."""
    types = getattr(node, "output_types", None)
    if isinstance(types, Mapping):
        declared = types.get(port)
        return declared if isinstance(declared, type) else None
    return None


def _compatible(declared: type, wanted: type | tuple[type, ...]) -> bool:
    wanted_types = wanted if isinstance(wanted, tuple) else (wanted,)
    return any(issubclass(declared, w) for w in wanted_types)
