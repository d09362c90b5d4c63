"""A minimal MCP tool server over stdio for the interrupt tests: one tool, ``wait``, that sleeps and answers 42.

A call with ``hold`` (a name) and ``$SLEEP_GATE`` set (a folder) writes ``<gate>/<name>.held`` and then waits
while ``<gate>/closed`` exists: the resume tests hold a task in the middle of a turn until they kill the run.

It speaks newline-delimited JSON-RPC directly instead of importing the MCP SDK, so it starts in milliseconds:
the tests measure flowllm's resume logic, not tool server start-up.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TOOL = {
    "name": "wait",
    "description": "Wait for the given number of seconds, then print the answer.",
    "inputSchema": {
        "type": "object",
        "properties": {"seconds": {"type": "number"}, "hold": {"type": "string"}},
        "required": ["seconds"],
    },
}


def reply(request_id: object, result: dict) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


def hold(name: object) -> None:
    gate = os.environ.get("SLEEP_GATE")
    if not name or not gate:
        return
    (Path(gate) / f"{name}.held").write_text("held")
    while (Path(gate) / "closed").exists():
        time.sleep(0.02)


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method = message.get("method")
        if "id" not in message:  # a notification: nothing to answer
            continue
        params = message.get("params") or {}
        if method == "initialize":
            reply(
                message["id"],
                {
                    "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": "tool-sleep", "version": "1.0"},
                },
            )
        elif method == "tools/list":
            reply(message["id"], {"tools": [TOOL]})
        elif method == "tools/call":
            arguments = params.get("arguments") or {}
            hold(arguments.get("hold"))
            time.sleep(float(arguments.get("seconds", 0)))
            reply(message["id"], {"content": [{"type": "text", "text": "42"}], "isError": False})
        elif method == "ping":
            reply(message["id"], {})
        else:
            sys.stdout.write(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "error": {"code": -32601, "message": f"method not found: {method}"},
                    }
                )
                + "\n"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
