"""Tools over MCP: the built-in servers and the per-run catalog and the per-task pool.

Public API (imported lazily, so that ``python -m flowllm.tools.python`` and the other servers start without
loading the pool's dependencies):

* ``open_tool_catalog(cfg)``: once per run: checks every server, keeps the ``scope: run`` ones connected.
* ``open_tool_pool(cfg, workspace, catalog=...)``: async context manager yielding a ``ToolPool`` (a
  ``ToolBackend``) for one task.

Modules, one job each: ``settings`` (the config, checked), ``connection`` (one server's session, restarts, the
client side of the protocol), ``routing`` (which server answers, argument checks), ``results`` (MCP content
to flowllm results), ``pool`` (the run's catalog and the task's pool).
* ``ToolPool``: ``list_tools()``, ``call(server, name, arguments, *, call_id, timeout_s)``, ``aclose()``.
* ``format_tool_result(result)`` and ``describe_tools_for_prompt(tools)``: the text protocol.
* ``validate_arguments(arguments, schema)``: the JSON Schema subset check the pool applies.

Built-in servers: ``flowllm.tools.python`` (``run_python``), ``flowllm.tools.files`` (``read_file``,
``list_files``), ``flowllm.tools.math`` (``calculate``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowllm.tools.client.pool import ToolCatalog, ToolPool, discover_tools, open_tool_catalog, open_tool_pool
    from flowllm.tools.client.settings import PoolSettings, ServerSpec, load_settings
    from flowllm.tools.client.textproto import describe_tools_for_prompt, format_tool_result
    from flowllm.tools.client.validation import validate_arguments

_EXPORTS = {
    "ToolPool": "flowllm.tools.client.pool",
    "open_tool_pool": "flowllm.tools.client.pool",
    "discover_tools": "flowllm.tools.client.pool",
    "ToolCatalog": "flowllm.tools.client.pool",
    "open_tool_catalog": "flowllm.tools.client.pool",
    "load_settings": "flowllm.tools.client.settings",
    "PoolSettings": "flowllm.tools.client.settings",
    "ServerSpec": "flowllm.tools.client.settings",
    "format_tool_result": "flowllm.tools.client.textproto",
    "describe_tools_for_prompt": "flowllm.tools.client.textproto",
    "validate_arguments": "flowllm.tools.client.validation",
}

__all__ = [
    "PoolSettings",
    "ServerSpec",
    "ToolCatalog",
    "ToolPool",
    "describe_tools_for_prompt",
    "discover_tools",
    "format_tool_result",
    "load_settings",
    "open_tool_catalog",
    "open_tool_pool",
    "validate_arguments",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flowllm.tools' has no attribute {name!r}")
    return getattr(import_module(module), name)
