"""Build a turn graph from its config and validate it before anything runs.

The graph is a ``networkx.DiGraph`` over node names: an edge A -> B exists when B consumes a state key that A
produces. Validation rules are small pure functions (``check_*``), each tested on its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from flowllm.engine.errors import (
    CycleError,
    DuplicateProducerError,
    MissingInputError,
    PipelineError,
    UnknownTargetError,
)
from flowllm.engine.node import BoundNode, node_ports

# Keys of a node's config that wire it into the graph instead of going to its constructor.
WIRING_KEYS = ("inputs", "outputs")


@dataclass
class Pipeline:
    """A validated turn graph: nodes in YAML order, the dependency graph, and a serial order."""

    nodes: list[BoundNode]
    graph: nx.DiGraph
    provided: tuple[str, ...]  # state keys the agent loop supplies at the start of every turn
    source: str = "<pipeline>"
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


def locate(target: str) -> object:
    """Import ``package.module.Name``; raises ImportError with a one-line reason."""
    parts = target.split(".")
    if not all(parts):
        raise ImportError(f"'{target}' is not a dotted path")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and not module_name.startswith(exc.name) and exc.name != module_name:
                raise ImportError(f"importing '{module_name}' failed: {exc}") from None
            continue
        for i, attr in enumerate(parts[cut:], start=cut):
            if not hasattr(obj, attr):
                raise ImportError(f"'{'.'.join(parts[:i])}' has no attribute '{attr}'")
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module named '{parts[0]}'")


def _locate_target(target: str, name: str, source: str) -> None:
    """Fail with a readable message when a ``_target_`` does not import (Hydra's own error is a traceback)."""
    try:
        locate(target)
    except ImportError as exc:
        raise UnknownTargetError(
            f"unknown _target_ '{target}' ({exc}). Set _target_ to an importable class path, "
            "e.g. flowllm.nodes.model.CallModel.",
            node=name,
            source=source,
        ) from None


def instantiate_nodes(nodes_cfg: Mapping[str, Any] | DictConfig, source: str) -> list[BoundNode]:
    """Build every node of a pipeline config, in YAML order."""
    if isinstance(nodes_cfg, DictConfig):
        items = [(str(k), v) for k, v in nodes_cfg.items()]
    else:
        items = [(str(k), v) for k, v in dict(nodes_cfg).items()]
    if not items:
        raise PipelineError("the pipeline has no nodes", source=source)
    return [instantiate_node(name, spec, index, source) for index, (name, spec) in enumerate(items, start=1)]


def instantiate_node(
    name: str, spec: Any, index: int, source: str, wiring_keys: Iterable[str] = WIRING_KEYS
) -> BoundNode:
    """Build one node from its config; ``wiring_keys`` are the keys that do not go to its constructor."""
    spec_dict: Any = OmegaConf.to_container(spec, resolve=True) if isinstance(spec, DictConfig) else spec
    if not isinstance(spec_dict, dict) or "_target_" not in spec_dict:
        raise PipelineError("has no _target_ (the class that implements it)", node=name, source=source)
    target = spec_dict["_target_"]
    if not isinstance(target, str):
        # Already-built objects are allowed in Python-built pipelines (tests, embedding).
        node_obj = target
    else:
        _locate_target(target, name, source)
        skip = set(wiring_keys)
        ctor = {k: v for k, v in spec_dict.items() if k not in skip}
        try:
            node_obj = instantiate(ctor, _convert_="all")
        except Exception as exc:
            cause = exc.__cause__ or exc
            raise PipelineError(
                f"could not build '{target}': {type(cause).__name__}: {cause}", node=name, source=source
            ) from None
    try:
        ports = node_ports(node_obj)
    except TypeError as exc:
        raise PipelineError(str(exc), node=name, source=source) from None
    input_map = dict(spec_dict.get("inputs") or {})
    output_map = dict(spec_dict.get("outputs") or {})
    _check_wiring(name, source, ports.required + ports.optional, input_map, "input")
    _check_wiring(name, source, ports.outputs, output_map, "output")
    return BoundNode(name, index, node_obj, ports, input_map, output_map)


def _check_wiring(name: str, source: str, ports: Iterable[str], mapping: Mapping[str, str], kind: str) -> None:
    known = set(ports)
    for port in mapping:
        if port not in known:
            raise PipelineError(
                f"renames {kind} '{port}', but the node has no such {kind} (it has: {', '.join(sorted(known))})",
                node=name,
                source=source,
            )


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
    nodes_cfg: Mapping[str, Any] | DictConfig,
    *,
    provided: Iterable[str] = ("messages", "system", "tools"),
    source: str = "<pipeline>",
    hooks: Mapping[str, Any] | DictConfig | None = None,
    hook_nodes: Mapping[str, Any] | DictConfig | None = None,
    hook_points: Mapping[str, Any] | DictConfig | None = None,
) -> Pipeline:
    """Instantiate, wire and validate a turn graph. Raises a ``PipelineError`` subclass when it is wrong.

    ``hooks``/``hook_nodes``/``hook_points`` insert nodes at hook points (flowllm/engine/hooks.py). When
    ``nodes_cfg`` is the ``nodes`` of a composed pipeline config and they are not given, they are read from
    that pipeline config (``pipeline.hooks`` ...), so a config override alone switches hooks on.
    """
    from flowllm.engine.hooks import HookConfig, insert_hooks

    provided = tuple(provided)
    nodes = instantiate_nodes(nodes_cfg, source)
    hook_cfg = HookConfig.from_config(
        nodes_cfg, hooks=hooks, hook_nodes=hook_nodes, hook_points=hook_points, source=source
    )
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
    return Pipeline(nodes=nodes, graph=graph, provided=provided, source=source)
