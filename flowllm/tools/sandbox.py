"""Run model-written Python in a child process with limits: wall clock, memory, CPU, file size, no network.

This is a *containment* layer for honest mistakes (an endless loop, a 50 MB print, a runaway allocation, a
stray download), not a security boundary against hostile code: the child runs as the same user.

How one run goes:

* A fresh interpreter starts with ``-P`` (nothing prepended to ``sys.path`` yet, so a ``socket.py`` among the
  task's files cannot hijack the bootstrap) in the workspace, in its own session so the whole process group
  can be killed at once.
* The bootstrap (``_BOOTSTRAP`` below) asks the kernel to kill it if the tool server dies
  (``PR_SET_PDEATHSIG``), sets ``RLIMIT_AS`` / ``RLIMIT_CPU`` / ``RLIMIT_FSIZE``, cuts the network (a new
  network namespace when the kernel allows it, else a guard on the ``socket`` module), reads the code from
  stdin and runs it as ``__main__`` with the workspace importable, like ``python script.py`` would.
* The parent reads stdout and stderr as they come, keeping the first and last part of each stream and only
  counting the middle, so a 50 MB print costs no memory; after the wall-clock timeout it kills the group.
* Whatever happens (normal exit, timeout, the caller cancelled), the process group is killed before
  ``run_python_code`` returns, so background children the code started do not outlive the call.

The child's environment is minimal and fixed (``PYTHONHASHSEED=0``, one BLAS thread, a private ``HOME``) so
the same code prints the same thing in every run, and the workspace's absolute path is scrubbed from the
output so two runs in different folders give identical results.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from flowllm.tools.common import scrub_workspace, workspace_spellings

SCRIPT_NAME = "<run_python>"

# Runs inside the child before the user's code. Kept free of flowllm imports: the child must not need them.
_BOOTSTRAP = r"""
import os, sys

def _limit(kind, value):
    import resource
    try:
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass

def _isolate_network():
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(0x40000000) == 0:  # CLONE_NEWNET: works as root
                return
            uid, gid = os.getuid(), os.getgid()
            if libc.unshare(0x10000000 | 0x40000000) == 0:  # CLONE_NEWUSER too: works unprivileged
                maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
                for name, text in maps:
                    try:
                        with open(f"/proc/self/{name}", "w") as fh:
                            fh.write(text)
                    except OSError:
                        pass
                return
        except Exception:
            pass
    import socket
    def _refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in run_python")
    for name in ("connect", "connect_ex", "sendto", "sendmsg", "bind"):
        setattr(socket.socket, name, _refuse)
    socket.getaddrinfo = _refuse
    socket.create_connection = _refuse

def _setup():
    mem_mb, cpu_s, fsize_mb, allow_net, parent = (int(a) for a in sys.argv[1:6])
    if sys.platform.startswith("linux"):
        try:
            import ctypes, signal
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except Exception:
            pass
        if os.getppid() != parent:  # the server died before prctl took effect
            os._exit(137)
    import resource
    if mem_mb > 0:
        _limit(resource.RLIMIT_AS, mem_mb * 1024 * 1024)
    if cpu_s > 0:
        _limit(resource.RLIMIT_CPU, cpu_s)
    if fsize_mb > 0:
        _limit(resource.RLIMIT_FSIZE, fsize_mb * 1024 * 1024)
    if not allow_net:
        _isolate_network()

def _main():
    _setup()
    code = sys.stdin.read()
    sys.stdin.close()
    sys.stdin = open(os.devnull)
    import linecache, traceback, types
    name = "<run_python>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    sys.argv = [name]
    sys.path.insert(0, os.getcwd())
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    try:
        exec(compile(code, name, "exec"), module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        # Skip this bootstrap's own frame: the model should see only its code in the traceback.
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb)
        sys.stderr.flush()
        sys.exit(1)

_main()
"""


@dataclass
class SandboxLimits:
    """Limits of one ``run_python`` call; ``0`` switches a resource limit off."""

    timeout_s: float = 30.0
    memory_mb: int = 2048
    max_file_mb: int = 512
    allow_network: bool = False
    # How much of each stream is kept: the first two thirds and the last third of this many bytes.
    max_stdout_chars: int = 20000
    max_stderr_chars: int = 8000


class _Capture:
    """Keeps the head and the tail of a stream and counts what falls in between."""

    def __init__(self, limit: int) -> None:
        self.head_limit = max(0, limit * 2 // 3)
        self.tail_limit = max(0, limit - self.head_limit)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk or self.tail_limit == 0:
            return
        self.tail.append(chunk)
        self.tail_size += len(chunk)
        while self.tail and self.tail_size - len(self.tail[0]) >= self.tail_limit:
            self.tail_size -= len(self.tail.popleft())

    def text(self) -> tuple[str, int]:
        """The kept text and how many bytes were cut from the middle."""
        tail = b"".join(self.tail)
        if len(tail) > self.tail_limit:
            tail = tail[len(tail) - self.tail_limit :]
        cut = self.total - len(self.head) - len(tail)
        head_text = self.head.decode("utf-8", errors="replace")
        tail_text = tail.decode("utf-8", errors="replace")
        if cut <= 0:
            return head_text + tail_text, 0
        return f"{head_text}\n[... {cut:,} bytes of output cut ...]\n{tail_text}", cut


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed on timeout; negative: killed by that signal
    timed_out: bool = False
    stdout_cut: int = 0
    stderr_cut: int = 0
    limits: SandboxLimits = field(default_factory=SandboxLimits)

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0

    def render(self) -> str:
        """The text the model sees: stdout, then stderr and a status line when there is something to say."""
        parts: list[str] = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr.strip():
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        status = self._status()
        if status:
            parts.append(status)
        if not parts:
            return "(no output: the code ran without printing anything; use print() to show results)"
        return "\n".join(parts)

    def _status(self) -> str:
        lim = self.limits
        if self.timed_out:
            return (
                f"[timed out: the code was still running after {lim.timeout_s:g} s and was stopped; "
                "output printed before that is shown above]"
            )
        code = self.exit_code
        if code is None or code == 0:
            return ""
        if code < 0:
            sig = -code
            if sig == signal.SIGXCPU:
                return f"[stopped: the CPU time limit ({_cpu_seconds(lim)} s) was reached]"
            if sig == signal.SIGKILL and lim.memory_mb:
                return f"[killed (signal SIGKILL): possibly over the memory limit of {lim.memory_mb} MB]"
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            return f"[killed by signal {name}]"
        if "MemoryError" in self.stderr[-2000:] and lim.memory_mb:
            return f"[exit status {code}: the code ran out of memory; the limit is {lim.memory_mb} MB]"
        return f"[exit status {code}]"


def _cpu_seconds(limits: SandboxLimits) -> int:
    # The CPU limit is only a backstop for the wall clock (a busy loop in threads could outrun it otherwise).
    return int(limits.timeout_s) + 5 if limits.timeout_s > 0 else 0


def _child_env(home: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": home,
        "XDG_CACHE_HOME": os.path.join(home, ".cache"),
        "MPLCONFIGDIR": os.path.join(home, ".matplotlib"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",  # so what a timed-out run printed before the kill is not lost in a buffer
        "PYTHONIOENCODING": "utf-8",
        "MPLBACKEND": "Agg",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TZ": "UTC",
    }


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _wait_exit(proc: asyncio.subprocess.Process, timeout_s: float) -> bool:
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


async def _pump(stream: asyncio.StreamReader | None, capture: _Capture) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        capture.feed(chunk)


async def run_python_code(
    code: str, workspace: Path, limits: SandboxLimits | None = None, *, home: str | None = None
) -> SandboxResult:
    """Run ``code`` with ``workspace`` as the working directory under ``limits``.

    Never raises for problems of the code itself (syntax errors, exceptions, timeouts, limits): those are in
    the result. ``asyncio.CancelledError`` propagates after the child's process group has been killed.
    """
    limits = limits or SandboxLimits()
    workspace = workspace.resolve()
    own_home = None
    if home is None:
        own_home = tempfile.mkdtemp(prefix="flowllm-sandbox-home-")
        home = own_home
    args = [
        sys.executable,
        "-P",
        "-X",
        "utf8",
        "-c",
        _BOOTSTRAP,
        str(limits.memory_mb),
        str(_cpu_seconds(limits)),
        str(limits.max_file_mb),
        "1" if limits.allow_network else "0",
        str(os.getpid()),
    ]
    out, err = _Capture(limits.max_stdout_chars), _Capture(limits.max_stderr_chars)
    timed_out = False
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=str(workspace),
        env=_child_env(home),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        pumps = asyncio.gather(_pump(proc.stdout, out), _pump(proc.stderr, err))
        try:
            assert proc.stdin is not None
            proc.stdin.write(code.encode("utf-8", errors="surrogatepass"))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await proc.stdin.drain()
            proc.stdin.close()
            timed_out = not await _wait_exit(proc, limits.timeout_s)
            # Kill the group in every case: the code may have left background children holding our pipes.
            _kill_group(proc.pid)
            # The group is dead, so the pipes reach EOF unless a grandchild escaped into its own session.
            try:
                await asyncio.wait_for(asyncio.shield(pumps), timeout=2.0)
            except TimeoutError:
                pumps.cancel()
            await _wait_exit(proc, 5.0)
        except BaseException:
            pumps.cancel()
            raise
    finally:
        if proc.returncode is None:
            _kill_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        else:
            _kill_group(proc.pid)
        if own_home is not None:
            _remove_tree(own_home)

    spellings = workspace_spellings(workspace)
    stdout_text, stdout_cut = out.text()
    stderr_text, stderr_cut = err.text()
    return SandboxResult(
        stdout=scrub_workspace(stdout_text, spellings),
        stderr=scrub_workspace(stderr_text, spellings),
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        stdout_cut=stdout_cut,
        stderr_cut=stderr_cut,
        limits=limits,
    )


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
