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

server = MCPServer("flaky", log_level="WARNING")


@server.tool()
async def sleep(seconds: float, label: str = "") -> str:
    """Sleep without blocking the server, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g} {label}".strip()


@server.tool()
async def block(seconds: float) -> str:
    """Block the server's event loop (a badly written async tool): the whole server stops answering."""
    time.sleep(seconds)
    return "blocked"


@server.tool()
def crash() -> str:
    """Kill the server process before answering."""
    os._exit(3)


@server.tool()
def crash_once(name: str) -> str:
    """Kill the server the first time it is called with ``name``; answer on the retry."""
    marker = Path(os.environ["FLAKY_STATE"]) / name
    if not marker.exists():
        marker.write_text("crashed")
        os._exit(4)
    return f"survived {name}"


@server.tool()
def big(chars: int) -> str:
    """Return a long text."""
    return "x" * chars


@server.tool()
def where() -> str:
    """Say which workspace the pool passed, and this process id."""
    return f"{os.environ.get('FLOWLLM_WORKSPACE', '')} pid={os.getpid()} key={os.environ.get('FLAKY_KEY', '')}"


@server.tool()
def pick(color: Literal["red", "green"], count: int, tags: list[str] | None = None) -> str:
    """Echo a validated choice."""
    return f"{count} {color} {tags or []}"


@server.tool()
def secret() -> str:
    """A tool the tests blacklist."""
    return "should never be seen"


if __name__ == "__main__":
    server.run()
