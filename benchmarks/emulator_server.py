"""The emulator served for thousands of connections at once: ``python -m benchmarks.emulator_server SCRIPT``.

The same application as ``python -m flowllm.emulator`` (``EmulatorApp``: the script, the three wire protocols, the
faults, the 100 ms ``delay``), served by uvicorn with what a production model endpoint has and the interactive
emulator does not need: a listen backlog of 4,096 instead of 128 (at 2,000 tasks, 2,000 connections arrive in
the same few milliseconds; past the backlog the kernel drops the connection attempts and the clients retry them
a second later, which measures the server's queue, not the client) and idle connections kept for 10 minutes
instead of uvicorn's 5 seconds (a client that is busy for more than 5 s between two calls of a task finds its
pooled connection closed under it, a race every client, SDK or not, loses now and then, and the run would
measure the reconnects). Prints the address on its first line, as ``python -m flowllm.emulator`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

BACKLOG = 4096
KEEP_ALIVE_S = 600


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from flowllm.emulator.script import Script
    from flowllm.emulator.server import EmulatorApp

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("script", help="the YAML script file")
    args = parser.parse_args(argv)
    app = EmulatorApp(Script.load(args.script))
    # IPPROTO_TCP explicitly, as the emulator does: asyncio sets TCP_NODELAY only on sockets that say so.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(BACKLOG)
    config = uvicorn.Config(
        app.app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
        timeout_keep_alive=KEEP_ALIVE_S,
        backlog=BACKLOG,
    )
    print(f"flowllm emulator on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
