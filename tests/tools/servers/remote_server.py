"""A real MCP server over streamable HTTP on 127.0.0.1, for tests that compose a remote (``url:``) server.

Run as a script (``python remote_server.py``): it binds a free port first, prints ``listening on PORT`` once the
socket accepts connections, then serves ``/mcp`` with the SDK's streamable-HTTP app under uvicorn.
"""

from __future__ import annotations

import socket

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("remote", log_level="WARNING")


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until uvicorn serves them: no start-up race
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
