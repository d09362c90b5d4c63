"""Which task folder a tool call works in, named by the client with each call.

A built-in server that keeps no per-task state (tool-python, tool-files, tool-audio) can serve every task of a
run from one process (``scope: run``): starting a Python process that imports the MCP SDK costs about half a
CPU second, once per server per task when servers are task-scoped. Such a server cannot learn the folder from
its environment, since one process serves many folders, so the pool names it in each call's ``_meta``
(``WORKSPACE_META_KEY``), for the tools that ask for it in their own ``meta`` (``asks_for_workspace``).

The client is flowllm itself, not the model: the model never sees or sets the folder, and a server still
confines every path to the folder it was given (``flowllm.tools.common.confine``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the client side (the pool) imports this module too, and must not load the MCP server
    from mcp.server.mcpserver import Context

WORKSPACE_META_KEY = "flowllm/workspace"


def asks_for_workspace() -> dict[str, Any]:
    """The tool ``meta`` a server declares to be told each call's task folder."""
    return {WORKSPACE_META_KEY: True}


def tool_asks_for_workspace(tool: Any) -> bool:
    """Client side: whether a listed tool wants the task folder in each call's ``_meta``."""
    meta = getattr(tool, "meta", None) or {}
    return bool(isinstance(meta, Mapping) and meta.get(WORKSPACE_META_KEY))


class TaskFolders:
    """Server side: the folder of each call, or the one the server was started for.

    ``default``: the folder given at start (``--workspace`` or ``$FLOWLLM_WORKSPACE``), used by calls that name
    none; ``None`` for a server shared by a run, whose calls must each name theirs.
    """

    def __init__(self, server_name: str, default: Path | None) -> None:
        self.server_name = server_name
        self.default = default.resolve() if default is not None else None

    def for_call(self, ctx: Context | None) -> Path:
        from mcp.server.mcpserver.exceptions import ToolError

        named = _named_folder(ctx)
        if named is not None:
            folder = Path(named)
            if not folder.is_absolute() or not folder.is_dir():
                raise ToolError(f"{self.server_name}: the task folder named by the client is not a folder: {named}")
            return folder.resolve()
        if self.default is not None:
            return self.default
        raise ToolError(
            f"{self.server_name} was started without a task folder and the call named none: start it with "
            "--workspace DIR (or $FLOWLLM_WORKSPACE), or call it through flowllm, which names the folder in "
            f"each call's _meta ({WORKSPACE_META_KEY})"
        )


def _named_folder(ctx: Context | None) -> str | None:
    if ctx is None:
        return None
    try:
        meta = ctx.request_context.meta
    except (AttributeError, ValueError, LookupError):  # no request in flight (a direct call in a test)
        return None
    value = meta.get(WORKSPACE_META_KEY) if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) and value else None
