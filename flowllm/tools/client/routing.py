"""Which server answers a call, and whether its arguments fit the tool: the pool's checks before any I/O.

A call names its server. A wrong or missing name is corrected only among servers that are up, and only when
exactly one of them offers the tool; a call to a server that failed to start (or is disabled) is not sent
elsewhere: the model is told why that server is unavailable and which running server offers the same tool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flowllm.tools.client.connection import ServerHandle
from flowllm.tools.client.validation import describe_signature, validate_arguments

READ_RESOURCE_TOOL = "read_resource"
READ_RESOURCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"uri": {"type": "string", "description": "the resource's URI, as a tool or listing gave it"}},
    "required": ["uri"],
}


def offers(handle: ServerHandle, name: str) -> bool:
    """Whether the server offers ``name`` to the model (its own tools, or the resource reader)."""
    if name in handle.spec.blacklist:
        return False
    return name in handle.tools or (name == READ_RESOURCE_TOOL and handle.resources)


def tool_names(handle: ServerHandle) -> list[str]:
    names = [t for t in handle.tools if t not in handle.spec.blacklist]
    if handle.resources and READ_RESOURCE_TOOL not in handle.tools and READ_RESOURCE_TOOL not in handle.spec.blacklist:
        names.append(READ_RESOURCE_TOOL)
    return names


def route(
    handles: Mapping[str, ServerHandle], unavailable: Mapping[str, str], server: str | None, name: str
) -> ServerHandle | str:
    """The handle serving ``server``/``name``, or the error message for the model."""
    live: Iterable[ServerHandle] = [h for h in handles.values() if h.tools and h.problem is None]
    handle = handles.get(server) if server else None
    if handle is not None and handle.problem is None and offers(handle, name):
        return handle
    if handle is not None and name in handle.spec.blacklist and name in handle.tools:
        return f"tool '{name}' on server '{server}' is disabled in this configuration"
    offering = [h for h in live if offers(h, name)]
    down = unavailable.get(server or "") or (handle.problem if handle is not None else None)
    if down:
        elsewhere = ", ".join(f"'{h.spec.name}'" for h in offering)
        also = f". Tool '{name}' is also offered by {elsewhere}: name that server" if elsewhere else ""
        return f"{down}{also}"
    if len(offering) == 1:
        return offering[0]  # a wrong or missing server name, corrected: only one running server has this tool
    if len(offering) > 1:
        names = ", ".join(f"'{h.spec.name}'" for h in offering)
        return f"tool '{name}' is offered by several servers ({names}); name the server"
    if any(name in h.spec.blacklist for h in handles.values() if name in h.tools):
        return f"tool '{name}' is disabled in this configuration"
    available = "; ".join(f"{h.spec.name}: {', '.join(tool_names(h))}" for h in live)
    where = f" on server '{server}'" if server else ""
    return f"unknown tool '{name}'{where}. Available tools: {available or 'none'}"


def argument_problem(handle: ServerHandle, name: str, arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the tool's input schema, with the expected signature; None when they fit."""
    tool = handle.tools.get(name)
    schema = dict(tool.input_schema or {}) if tool is not None else READ_RESOURCE_SCHEMA
    problems = validate_arguments(arguments, schema)
    if not problems:
        return None
    server = handle.spec.name
    return f"invalid arguments for {server}.{name}: {'; '.join(problems)}. Expected: {describe_signature(schema)}"
