"""Build nodes from their config: import the ``_target_``, construct it, read its ports, check the wiring.

Shared by the pipeline builder and the hook inserter (hooks are nodes too).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from hydra.utils import instantiate

from flowllm.engine.errors import PipelineError, UnknownTargetError
from flowllm.engine.node import BoundNode, node_ports
from flowllm.errors import ConfigError

# Keys of a node's config that wire it into the graph instead of going to its constructor.
WIRING_KEYS = ("inputs", "outputs")

__all__ = ["WIRING_KEYS", "instantiate_node", "instantiate_nodes", "locate"]


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


def instantiate_nodes(nodes_cfg: Mapping[str, Any], source: str) -> list[BoundNode]:
    """Build every node of a pipeline config (plain mappings: the loader resolved it), in YAML order."""
    items = [(str(k), v) for k, v in dict(nodes_cfg).items()]
    if not items:
        raise PipelineError("the pipeline has no nodes", source=source)
    return [instantiate_node(name, spec, index, source) for index, (name, spec) in enumerate(items, start=1)]


def instantiate_node(
    name: str, spec: Any, index: int, source: str, wiring_keys: Iterable[str] = WIRING_KEYS
) -> BoundNode:
    """Build one node from its config (a plain mapping); ``wiring_keys`` are the keys that do not go to its
    constructor."""
    spec_dict: Any = dict(spec) if isinstance(spec, Mapping) else spec
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
            if isinstance(cause, ConfigError):  # a setting the node was given names no choice: it says which
                raise cause from None
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
