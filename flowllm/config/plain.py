"""A section of a composed config as plain data: what the layers below the run's set-up are given (the
``pipeline`` for ``flowllm.engine.pipeline_from_config``, the ``tools`` for ``flowllm.tools.load_settings``).

``${workspace}`` in a server's ``args``, ``env`` and ``cwd`` is the task's folder, substituted when the server
starts. OmegaConf would read it as an interpolation of a root key, so the strings that hold it are kept as
written; every other value is resolved as usual.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

WORKSPACE_TOKEN = "${workspace}"

__all__ = ["WORKSPACE_TOKEN", "plain_config"]


def plain_config(node: Any) -> Any:
    """A DictConfig or ListConfig as plain dicts and lists, interpolations resolved except in strings holding
    ``${workspace}``; a missing value (``???``) is None. Anything else is returned as it is."""
    if not isinstance(node, DictConfig | ListConfig):
        return node
    raw = OmegaConf.to_container(node, resolve=False)
    keys: Any = node.keys() if isinstance(node, DictConfig) else range(len(node))
    out: dict[Any, Any] = {}
    for key in keys:
        raw_value = raw[key]  # type: ignore[index]
        if isinstance(raw_value, str) and WORKSPACE_TOKEN in raw_value:
            out[key] = raw_value
        elif OmegaConf.is_missing(node, key):
            out[key] = None
        else:
            out[key] = plain_config(node[key])
    return out if isinstance(node, DictConfig) else [out[i] for i in keys]
