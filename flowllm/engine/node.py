"""The node contract.

A node is a small object built by Hydra from its ``_target_``. It has:

* **inputs**: the keyword parameters of its ``run`` method after ``ctx``. A parameter without a default is
  required; one with a default is optional (the engine passes it only when some node or the turn provides it).
* **outputs**: the names in its class attribute ``outputs``. ``run`` returns a dict with exactly those keys.
* **run(ctx, **inputs)**, plain or ``async``. ``ctx`` is the ``TurnContext``: the services of the turn
  (provider, tools, ...) and the runner's way of executing fan-out work (``ctx.map``). Nodes keep no state
  between turns and read nothing global, so any runner may schedule them.

In the pipeline YAML, ``inputs: {port: state_key}`` and ``outputs: {port: state_key}`` rename a node's ports
on the turn's shared state; everything else besides ``_target_`` goes to the node's constructor.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, ClassVar

from flowllm.rundir.layout import node_folder


class Node:
    """Base class for nodes. Subclasses set ``outputs`` and define ``run(self, ctx, <inputs>) -> dict``.

    ``run`` is deliberately not declared here: each node's signature *is* its input declaration, which no
    single base signature could type. ``node_ports`` checks the contract when the pipeline is built.
    """

    outputs: ClassVar[tuple[str, ...]] = ()
    # Optional: the type of some outputs, checked against the caller's contract (engine/contract.py) when the
    # pipeline is built.
    output_types: ClassVar[Mapping[str, type]] = MappingProxyType({})


@dataclass(frozen=True)
class Ports:
    required: tuple[str, ...]
    optional: tuple[str, ...]
    outputs: tuple[str, ...]
    is_async: bool


def node_ports(node: object) -> Ports:
    """Read a node's ports from its ``run`` signature and ``outputs`` attribute."""
    run = getattr(node, "run", None)
    if run is None or not callable(run):
        raise TypeError(f"{type(node).__qualname__} has no run() method")
    params = list(inspect.signature(run).parameters.values())
    if not params or params[0].name != "ctx":
        raise TypeError(f"{type(node).__qualname__}.run must take 'ctx' as its first parameter")
    required: list[str] = []
    optional: list[str] = []
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{type(node).__qualname__}.run must name its inputs (no *args/**kwargs)")
        (required if p.default is p.empty else optional).append(p.name)
    outputs = tuple(getattr(node, "outputs", ()))
    if not outputs:
        raise TypeError(f"{type(node).__qualname__} declares no outputs")
    return Ports(tuple(required), tuple(optional), outputs, inspect.iscoroutinefunction(run))


@dataclass
class BoundNode:
    """A node placed in a pipeline: its name, position, instance and the wiring of its ports to state keys."""

    name: str
    index: int  # position in the YAML; names the artifact folder (NN_name) whatever the runner's order
    node: Any
    ports: Ports
    input_map: Mapping[str, str] = field(default_factory=dict)  # port -> state key
    output_map: Mapping[str, str] = field(default_factory=dict)

    def input_key(self, port: str) -> str:
        return self.input_map.get(port, port)

    def output_key(self, port: str) -> str:
        return self.output_map.get(port, port)

    @property
    def consumes(self) -> dict[str, bool]:
        """State keys read, mapped to whether they are required."""
        keys = {self.input_key(p): True for p in self.ports.required}
        for p in self.ports.optional:
            keys.setdefault(self.input_key(p), False)
        return keys

    @property
    def produces(self) -> tuple[str, ...]:
        return tuple(self.output_key(p) for p in self.ports.outputs)

    @cached_property
    def folder(self) -> str:
        """Its record folder's name (``NN_name``): spelled once, every turn's records name it."""
        return node_folder(self.index, self.name)
