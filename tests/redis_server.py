"""A real Redis server on a free loopback port, for the runs that keep their spend and rate limits together
(``experiment.coordination``); .ci/run installs the Debian package redis-server."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

MISSING = "redis-server is not installed (Debian package redis-server; .ci/run installs it)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[str | None]:
    """A running server's URL (database 0) until the block ends; None when redis-server is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*args, "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
