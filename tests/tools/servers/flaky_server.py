"""A real MCP stdio server whose tools misbehave on purpose, for the pool's tests.

Run as a script (``python flaky_server.py``); it needs only ``mcp``. ``FLAKY_STATE`` names a folder where
``crash_once`` leaves a marker, so the first call kills the server and the retried call succeeds.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("flaky", log_level="WARNING")
# Safe to re-run after a crash: the pool retries these; write_once (a side effect) it does not.
READ_ONLY = ToolAnnotations(readOnlyHint=True)


@server.tool(annotations=READ_ONLY)
async def sleep(seconds: float, label: str = "") -> str:
    """Sleep without blocking the server, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g} {label}".strip()


@server.tool()
async def block(seconds: float) -> str:
    """Block the server's event loop (a badly written async tool): the whole server stops answering."""
    time.sleep(seconds)
    return "blocked"


@server.tool(annotations=READ_ONLY)
def crash() -> str:
    """Kill the server process before answering."""
    os._exit(3)


@server.tool()
def write_once(name: str) -> str:
    """A tool with a side effect (not idempotent): append a line, then die the first time."""
    marker = Path(os.environ["FLAKY_STATE"]) / name
    with marker.open("a") as fh:
        fh.write("acted\n")
    if marker.read_text().count("acted") == 1:
        os._exit(5)
    return f"wrote {name}"


@server.tool(annotations=ToolAnnotations(idempotentHint=True))
def crash_once(name: str) -> str:
    """Kill the server the first time it is called with ``name``; answer on the retry."""
    marker = Path(os.environ["FLAKY_STATE"]) / name
    if not marker.exists():
        marker.write_text("crashed")
        os._exit(4)
    return f"survived {name}"


@server.tool(annotations=READ_ONLY)
def big(chars: int) -> str:
    """Return a long text."""
    return "x" * chars


@server.tool(annotations=READ_ONLY)
def where() -> str:
    """Say which workspace the pool passed, and this process id."""
    return f"{os.environ.get('FLOWLLM_WORKSPACE', '')} pid={os.getpid()} key={os.environ.get('FLAKY_KEY', '')}"


@server.tool(annotations=READ_ONLY)
def pick(color: Literal["red", "green"], count: int, tags: list[str] | None = None) -> str:
    """Echo a validated choice."""
    return f"{count} {color} {tags or []}"


@server.tool()
def secret() -> str:
    """A tool the tests blacklist."""
    return "should never be seen"


if __name__ == "__main__":
    server.run()
