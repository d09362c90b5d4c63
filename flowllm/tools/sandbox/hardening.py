"""Process hardening around sandboxed children: keep the server's own memory from other users, and kill a
child's whole session and cgroup so that nothing it started outlives its call."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

from flowllm.tools.sandbox import cgroup


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def wait_exit(proc: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Whether the child exited within ``timeout_s`` (``<= 0``: no limit).

    Polls ``returncode`` instead of ``proc.wait()``: on Python 3.11+ ``wait()`` also waits for the pipes to
    close, so a background child that inherited them would make a finished run look like it hangs.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s if timeout_s > 0 else None
    delay = 0.002
    while proc.returncode is None:
        if deadline is not None and loop.time() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.02)
    return True


def kill_all(pid: int, group: cgroup.Cgroup | None) -> None:
    """Kill the code's session and, where there is one, its cgroup (which holds the children that left it)."""
    kill_group(pid)
    if group is not None:
        group.kill()


def protect_process() -> None:
    """Make this process's memory and ``/proc/<pid>/environ`` unreadable to other non-root processes.

    ``PR_SET_DUMPABLE(0)``: a cheap second wall behind the sandbox for the flowllm process, which holds the
    API keys. Harmless where it is not supported.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE


def remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
