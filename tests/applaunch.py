"""The interpreter a forked app starts its Python children with, in the tests (see ``tests/appfork.py``).

A run of the app starts Python children: its tool servers (``python -m flowllm.tools.files``...) and its workers
(``python -m flowllm --config-name ...``), each a fresh interpreter that imports the MCP SDK or the whole app, about
a CPU-second or more each. In a forked app, ``sys.executable`` is this script (the zygote writes it next to its
socket, under a ``#!`` line naming the real interpreter with ``-S -I``, so it imports nothing but the standard
library). For ``-m`` of a flowllm or test module, it asks the zygote to fork that module for it with this
process's standard streams, working folder and environment, then stands in for it: the signals it is sent are
passed on, and it exits as the module's process exited (by the same signal, if one ended it). If it dies first,
SIGKILL included, the zygote ends the module's process. Anything else runs the real interpreter (``exec``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _forkable(argv: list[str]) -> bool:
    if len(argv) < 2 or argv[0] != "-m":
        return False
    module = argv[1]
    return module == "flowllm" or module.startswith(("flowllm.", "tests."))


def _exec_real() -> None:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])


class _Replies:
    """The zygote's replies, a line each: the module's pid, then its exit status."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def next(self) -> int | None:
        """The next number, or None when the connection ended first."""
        while b"\n" not in self.buffer:
            chunk = self.conn.recv(4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return int(line)


def main() -> None:
    argv = sys.argv[1:]
    if not _forkable(argv):
        _exec_real()
    request = {
        "module": argv[1],
        "args": argv[2:],
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "launcher": True,
    }
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(os.path.join(os.path.dirname(os.path.abspath(__file__)), "socket"))
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        replies = _Replies(conn)
        pid = replies.next()
    except OSError:
        pid = None
    if pid is None:  # no zygote (it has ended): a fresh interpreter, as without one
        conn.close()
        _exec_real()
        return
    child = pid

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    code = replies.next()
    if code is None:  # no status: the zygote went away
        code = 70
    if code < 0:  # ended by a signal: end the same way, so whoever waits on this process sees it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
