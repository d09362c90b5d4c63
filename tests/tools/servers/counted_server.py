"""A real MCP stdio server that counts its starts, for tests that check how often a server is started.

Run as a script (``python counted_server.py``); it needs only ``mcp``. Each start appends one line to the file
that ``COUNTED_LOG`` names, then the server serves ``echo`` until its client closes it.
"""

from __future__ import annotations

import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("counted", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """The text, unchanged."""
    return text


if __name__ == "__main__":
    with Path(os.environ["COUNTED_LOG"]).open("a", encoding="utf-8") as log:
        log.write(f"{os.getpid()}\n")
    server.run()
