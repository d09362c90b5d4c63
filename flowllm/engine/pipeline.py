"""Build a turn graph from its config and validate it before anything runs.

The graph is a ``networkx.DiGraph`` over node names: an edge A -> B exists when B consumes a state key that A
produces. Validation rules are small pure functions (``check_*``), each tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from flowllm.engine.contract import TurnContract
from flowllm.engine.errors import CycleError, DuplicateProducerError, MissingInputError, PipelineError
from flowllm.engine.hooks import HookConfig, insert_hooks
from flowllm.engine.instantiate import instantiate_nodes
from flowllm.engine.node import BoundNode


@dataclass
class Pipeline:
    """A validated turn graph: nodes in YAML order, the dependency graph, and a serial order."""

    nodes: list[BoundNode]
    graph: nx.DiGraph
    provided: tuple[str, ...]  # state keys the agent loop supplies at the start of every turn
    source: str = "<pipeline>"
    contract: TurnContract | None = None  # what the caller supplies and reads, checked at build time
    topological: list[BoundNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        by_name = {n.name: n for n in self.nodes}
        order = nx.lexicographical_topological_sort(self.graph, key=lambda name: by_name[name].index)
        self.topological = [by_name[name] for name in order]
        # For graph_parallel: per node, how many producers it waits for, and who waits for it.
        self.predecessors = {n.name: tuple(self.graph.predecessors(n.name)) for n in self.nodes}
        self.successors = {n.name: tuple(self.graph.successors(n.name)) for n in self.nodes}

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(key for n in self.nodes for key in n.produces)

    def node(self, name: str) -> BoundNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def check_producers(nodes: list[BoundNode], provided: Iterable[str], source: str) -> dict[str, str]:
    """Each state key has at most one producer (the turn's provided keys count as one)."""
    producers: dict[str, str] = {key: "<turn input>" for key in provided}
    for n in nodes:
        for key in n.produces:
            if key in producers:
                raise DuplicateProducerError(
                    f"produces '{key}', which {_who(producers[key])} already produces. Rename one of them "
                    f"with 'outputs: {{port: other_name}}'.",
                    node=n.name,
                    source=source,
                )
            producers[key] = n.name
    return producers


def _who(producer: str) -> str:
    return "the agent loop" if producer == "<turn input>" else f"node '{producer}'"


def check_inputs(nodes: list[BoundNode], producers: Mapping[str, str], source: str) -> None:
    """Every required input has a producer."""
    for n in nodes:
        for key, required in n.consumes.items():
            if required and key not in producers:
                available = ", ".join(sorted(producers)) or "nothing"
                raise MissingInputError(
                    f"needs input '{key}', but no node produces it and the turn does not provide it "
                    f"(available: {available}). Add a node that produces it or rename the input with "
                    f"'inputs: {{port: existing_key}}'.",
                    node=n.name,
                    source=source,
                )


def build_graph(nodes: list[BoundNode], producers: Mapping[str, str]) -> nx.DiGraph:
    graph = nx.DiGraph()
    for n in nodes:
        graph.add_node(n.name)
    for n in nodes:
        for key in n.consumes:
            producer = producers.get(key)
            if producer is not None and producer != "<turn input>":
                graph.add_edge(producer, n.name, key=key)
    return graph


def check_acyclic(graph: nx.DiGraph, source: str) -> None:
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return
    path = " -> ".join([edge[0] for edge in cycle] + [cycle[0][0]])
    raise CycleError(
        f"the nodes form a cycle ({path}); a turn graph must be acyclic. Break it by renaming an input or output.",
        node=cycle[0][0],
        source=source,
    )


def build_pipeline(
    nodes_cfg: Mapping[str, Any],
    *,
    provided: Iterable[str] | None = None,
    contract: TurnContract | None = None,
    source: str = "<pipeline>",
    hooks: Mapping[str, Any] | None = None,
    hook_nodes: Mapping[str, Any] | None = None,
    hook_points: Mapping[str, Any] | None = None,
) -> Pipeline:
    """Instantiate, wire and validate a turn graph. Raises a ``PipelineError`` subclass when it is wrong.

    ``nodes_cfg`` and the hook settings are plain mappings (a composed config is turned into them by
    ``pipeline_from_config``). ``hooks``/``hook_nodes``/``hook_points`` insert nodes at hook points
    (flowllm/engine/hooks.py): a pipeline config's ``pipeline.hooks`` ..., so a config override alone switches
    hooks on.

    ``contract`` states what the caller provides each turn (its required ``consumes``, unless ``provided`` is
    given) and what it reads afterwards; a pipeline that does not produce it is refused here.
    """
    if provided is None:
        provided = contract.provided if contract is not None else ("messages", "system", "tools")
    provided = tuple(provided)
    nodes = instantiate_nodes(nodes_cfg, source)
    hook_cfg = HookConfig.from_config(hooks=hooks, hook_nodes=hook_nodes, hook_points=hook_points, source=source)
    if hook_cfg.active:
        nodes = insert_hooks(nodes, hook_cfg, provided, source)
    names = [n.name for n in nodes]
    for name in provided:
        if name in names:
            raise PipelineError(f"a node may not be named like the turn input '{name}'", node=name, source=source)
    producers = check_producers(nodes, provided, source)
    check_inputs(nodes, producers, source)
    graph = build_graph(nodes, producers)
    check_acyclic(graph, source)
    if contract is not None:
        contract.check(nodes, source)
    return Pipeline(nodes=nodes, graph=graph, provided=provided, source=source, contract=contract)


def pipeline_from_config(
    pipeline_cfg: Mapping[str, Any],
    *,
    provided: Iterable[str] | None = None,
    contract: TurnContract | None = None,
    source: str = "<pipeline>",
) -> Pipeline:
    """``build_pipeline`` of a whole pipeline section (plain mappings): its ``nodes`` and its hook settings."""
    return build_pipeline(
        pipeline_cfg.get("nodes") or {},
        provided=provided,
        contract=contract,
        source=source,
        hooks=pipeline_cfg.get("hooks"),
        hook_nodes=pipeline_cfg.get("hook_nodes"),
        hook_points=pipeline_cfg.get("hook_points"),
    )
