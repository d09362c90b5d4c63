"""Hooks: places in the turn graph where a config inserts nodes, without touching the pipeline's own YAML.

A hook point sits on state keys (``DEFAULT_POINTS``; a pipeline may add or change points with
``pipeline.hook_points``)::

    on_history        messages                                    before anything reads the history
    on_system_prompt  system                                      before anything reads the system prompt
    before_model      prompt_messages, prompt_system, prompt_tools  the request, just before call_model
    after_model       response                                    the normalised reply, before it is parsed
    after_turn        next_messages                               the history after the turn's tool results

A hook node is an ordinary node. Its ports named like its point's keys are *interposed*: a hook with input and
output ``response`` receives the reply and what it returns is what every later node (and the agent loop) sees.
Several hooks at one point form a chain in their listed order. A hook that only reads a point's keys observes
them (a logger). Its other outputs are namespaced ``<hook name>.<port>`` so two hooks never collide.

Configuration (``conf/pipeline/*.yaml``)::

    hooks:                      # point -> list of hook names (from hook_nodes) or inline node configs
      before_model: [log_requests]
    hook_nodes:                 # named hook nodes; `enabled: true` inserts one without listing it
      log_requests: {point: before_model, _target_: flowllm.nodes.hooks.LogRequests}

so ``pipeline.hooks.before_model=[log_requests]`` on the command line switches a hook on. Hook nodes are
inserted into the node list where the legacy runner needs them (right after the producer of their point's
keys, or before the first reader of a turn input) and all nodes are then numbered in that order: without
hooks the folders stay exactly as before (01_trim_history ... 07_dispatch_tools).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flowllm.engine.errors import PipelineError
from flowllm.engine.instantiate import WIRING_KEYS, instantiate_node
from flowllm.engine.node import BoundNode

# Processing order matters: the history is settled first (compaction), then the system prompt (memory), so
# a hook of a later point may read what an earlier one produced without forming a cycle.
DEFAULT_POINTS: dict[str, tuple[str, ...]] = {
    "on_history": ("messages",),
    "on_system_prompt": ("system",),
    "before_model": ("prompt_messages", "prompt_system", "prompt_tools"),
    "after_model": ("response",),
    "after_turn": ("next_messages",),
}
HOOK_WIRING_KEYS = (*WIRING_KEYS, "point", "enabled", "name")


@dataclass(frozen=True)
class HookEntry:
    name: str
    point: str
    spec: dict[str, Any]


@dataclass
class HookConfig:
    """The hooks of one pipeline: its points and, per point, the nodes to insert in order."""

    points: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_POINTS))
    entries: dict[str, list[HookEntry]] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return any(self.entries.values())

    @classmethod
    def from_config(
        cls,
        *,
        hooks: Any = None,
        hook_nodes: Any = None,
        hook_points: Any = None,
        source: str = "<pipeline>",
    ) -> HookConfig:
        """Read hooks from a pipeline config's ``hooks``, ``hook_nodes`` and ``hook_points`` (plain mappings)."""
        points = dict(DEFAULT_POINTS)
        for point, keys in (_plain(hook_points) or {}).items():
            points[str(point)] = tuple(str(k) for k in (keys or ()))
        named: dict[str, dict[str, Any]] = {}
        for name, spec in (_plain(hook_nodes) or {}).items():
            if not isinstance(spec, dict):
                raise PipelineError("a hook node must be a mapping with a _target_", node=str(name), source=source)
            named[str(name)] = spec
        config = cls(points=points)

        def add(name: str, point: str, spec: dict[str, Any]) -> None:
            if point not in points:
                raise PipelineError(
                    f"unknown hook point '{point}' (known: {', '.join(points)}); add it under pipeline.hook_points",
                    node=name,
                    source=source,
                )
            listed = config.entries.setdefault(point, [])
            if any(e.name == name for e in listed):
                return  # enabled in hook_nodes and also listed: inserted once
            listed.append(HookEntry(name, point, spec))

        # Hooks switched on by their own config (memory.enabled, agent.compaction.enabled) come first.
        for name, spec in named.items():
            if spec.get("enabled") is True:
                if not spec.get("point"):
                    raise PipelineError("an enabled hook node needs a 'point'", node=name, source=source)
                add(name, str(spec["point"]), spec)
        for point, items in (_plain(hooks) or {}).items():
            for item in items or ():
                if isinstance(item, str):
                    if item not in named:
                        known = ", ".join(sorted(named)) or "none"
                        raise PipelineError(
                            f"hook '{item}' at '{point}' is not defined in pipeline.hook_nodes (known: {known}); "
                            "name one of them or give an inline node config with a _target_",
                            source=source,
                        )
                    add(item, str(point), named[item])
                elif isinstance(item, dict):
                    add(str(item.get("name") or _default_name(item)), str(point), item)
                else:
                    raise PipelineError(
                        f"hooks.{point}: an entry must be a hook name or a node config, not {item!r}", source=source
                    )
        return config


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _default_name(spec: Mapping[str, Any]) -> str:
    target = spec.get("_target_")
    cls_name = target.rsplit(".", 1)[-1] if isinstance(target, str) else type(target).__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls_name).lower()


def _unique(name: str, point: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    candidate = f"{name}_{point}"
    n = 2
    while candidate in taken:
        candidate = f"{name}_{point}_{n}"
        n += 1
    return candidate


def _with_input(node: BoundNode, old_key: str, new_key: str) -> BoundNode:
    """``node`` reading ``new_key`` wherever it read ``old_key``."""
    ports = node.ports.required + node.ports.optional
    changed = {p: new_key for p in ports if node.input_key(p) == old_key}
    return replace(node, input_map={**node.input_map, **changed}) if changed else node


def _with_output(node: BoundNode, old_key: str, new_key: str) -> BoundNode:
    changed = {p: new_key for p in node.ports.outputs if node.output_key(p) == old_key}
    return replace(node, output_map={**node.output_map, **changed}) if changed else node


def insert_hooks(nodes: list[BoundNode], config: HookConfig, provided: tuple[str, ...], source: str) -> list[BoundNode]:
    """The pipeline's nodes with every configured hook wired in and all nodes renumbered in list order."""
    nodes = list(nodes)
    taken = {n.name for n in nodes}
    for point, keys in config.points.items():
        entries = config.entries.get(point) or []
        if not entries:
            continue
        hooks: list[BoundNode] = []
        for entry in entries:
            name = _unique(entry.name, point, taken)
            taken.add(name)
            hooks.append(instantiate_node(name, entry.spec, 0, source, HOOK_WIRING_KEYS))
        producers: dict[str, int] = {}
        for i, n in enumerate(nodes):
            for key in n.produces:
                producers[key] = i
        present = [k for k in keys if k in producers or k in provided]
        if not present:
            raise PipelineError(
                f"is a '{point}' hook, but this pipeline neither provides nor produces {', '.join(keys)}",
                node=hooks[0].name,
                source=source,
            )
        made = [producers[k] for k in present if k in producers]
        if made:
            pos = max(made) + 1
        else:
            readers = [i for i, n in enumerate(nodes) if any(k in n.consumes for k in present)]
            pos = min(readers, default=len(nodes))
        # Other outputs get the hook's name as a prefix (unless the config renamed them).
        for h_i, hook in enumerate(hooks):
            extra = {
                p: f"{hook.name}.{p}"
                for p in hook.ports.outputs
                if p not in hook.output_map and hook.output_key(p) not in present
            }
            if extra:
                hooks[h_i] = replace(hook, output_map={**hook.output_map, **extra})
        for key in present:
            writers = [i for i, h in enumerate(hooks) if key in h.produces]
            if not writers:
                continue
            if key in producers:
                # The original producer now writes a private version; the last writing hook writes the key
                # itself, so every reader downstream (and the agent loop) sees the hooked value.
                original = f"{key}@{nodes[producers[key]].name}"
                nodes[producers[key]] = _with_output(nodes[producers[key]], key, original)
                current = original
            else:
                current = key
            for i, hook in enumerate(hooks):
                hook = _with_input(hook, key, current) if current != key else hook
                if i in writers:
                    version = key if (key in producers and i == writers[-1]) else f"{key}@{hook.name}"
                    hook = _with_output(hook, key, version)
                    current = version
                hooks[i] = hook
            if key not in producers:
                # A turn input: the nodes that read it from here on read the last hook's version instead.
                for i in range(pos, len(nodes)):
                    nodes[i] = _with_input(nodes[i], key, current)
        nodes[pos:pos] = hooks
    return [replace(n, index=i) for i, n in enumerate(nodes, start=1)]
