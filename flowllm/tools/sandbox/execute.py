"""Run model-written Python in a child process that can reach nothing but its task's folder.

The code is hostile until proven otherwise: it may look for API keys, for the benchmark's answers, for other
tasks' results, or try to outlive its call. As root (the usual case in a container) one run goes:

* A fresh interpreter starts with ``-P`` (nothing prepended to ``sys.path``, so a ``socket.py`` among the
  task's files cannot hijack the bootstrap) in its own session, with an environment built from a fixed
  allowlist (``child_env``): no variable of ours, so no key, reaches it.
* The bootstrap (``flowllm/tools/child/sandbox_boot.py``) joins the call's cgroup (``flowllm.tools.sandbox.cgroup``:
  one memory budget and one process cap for the code and all its children), then unshares the mount, PID,
  IPC, UTS and network namespaces and builds a new root on a tmpfs: the system folders and the Python install
  read-only, the workspace read-write at its own path, a private size-capped ``/tmp`` (``HOME`` lives there)
  and a minimal ``/dev``. The run directory, the dataset, the project and other tasks are simply not there.
* It forks: the child is the first process of the new PID namespace (when it dies, the kernel kills all the
  code started, double-forked ``setsid`` daemons included), mounts its own ``/proc`` (so no other process's
  ``environ`` is visible), ``chroot``s, drops to an unprivileged uid of this server's own (``sandbox_uid``),
  sets ``PR_SET_NO_NEW_PRIVS``, ``PR_SET_PDEATHSIG``, ``RLIMIT_AS`` / ``CPU`` / ``FSIZE`` / ``NPROC``, reads the
  code from stdin and runs it as ``__main__`` with the workspace importable, like ``python script.py`` would.
* The parent reads stdout and stderr as they come, keeping the first and last part of each stream and only
  counting the middle, so a 50 MB print costs no memory; it watches the workspace's size (``RLIMIT_FSIZE``
  bounds one file, not how many); after the wall-clock timeout it kills the session and the cgroup.
* Whatever happens (normal exit, timeout, the caller cancelled), everything is killed and the cgroup removed
  before ``run_python_code`` returns.

When flowllm is not root, bubblewrap builds the same sandbox instead (``flowllm.tools.sandbox.isolation``).

Where a part cannot be had (not root and no working bwrap: no privilege drop, no private filesystem, no PID
namespace; no writable cgroup: memory limited per process), the bootstrap falls back to what works (an
unprivileged user namespace for the network, a socket guard at worst) and reports the gaps
(``SandboxResult.gaps``, worded in ``GAP_TEXT``); ``Isolation.REQUIRED`` makes it refuse to run the code instead.

The child's environment is minimal and fixed (``PYTHONHASHSEED=0``, one BLAS thread, a private ``HOME``) so
the same code prints the same thing in every run, and the workspace's absolute path is scrubbed from the
output so two runs in different folders give identical results.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flowllm.core.scratch import new_scratch
from flowllm.tools.child import program
from flowllm.tools.common import scrub_workspace, workspace_spellings
from flowllm.tools.sandbox import cgroup
from flowllm.tools.sandbox.call import (
    Isolation,
    SandboxBackend,
    SandboxLimits,
    SandboxResult,
    StreamCapture,
    cpu_seconds,
)
from flowllm.tools.sandbox.hardening import kill_all, protect_process, remove_tree, wait_exit
from flowllm.tools.sandbox.isolation import (
    SANDBOX_HOME,
    BwrapProbe,
    bwrap_command,
    child_env,
    describe_gaps,
    probe_bwrap,
    python_paths,
    sandbox_uid,
    traversable_by_others,
    workspace_mounts,
)

# The run_python API, in one place for its callers (the tool server, the app's start-up checks).
__all__ = [
    "Isolation",
    "SandboxBackend",
    "SandboxLimits",
    "SandboxResult",
    "describe_gaps",
    "probe_bwrap",
    "protect_process",
    "python_paths",
    "run_python_code",
    "sandbox_uid",
]


async def _pump(stream: asyncio.StreamReader | None, capture: StreamCapture) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        capture.feed(chunk)


def _own_workspace(workspace: Path, uid: int) -> None:
    """Give the workspace to the sandbox's uid so the code can write there (and only there)."""
    os.chown(workspace, uid, uid)
    for folder, dirs, files in os.walk(workspace):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)
    os.chmod(workspace, 0o700)


def _tree_size(root: Path, cap: int) -> int:
    """Bytes under ``root``, stopping early once past ``cap``."""
    total = 0
    stack = [str(root)]
    while stack and total <= cap:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


async def _watch_workspace(workspace: Path, limit_mb: int, on_exceeded: Callable[[], None]) -> None:
    """Stop the code when the workspace grows past its cap (RLIMIT_FSIZE bounds one file, not how many)."""
    cap = limit_mb * 1024 * 1024
    while True:
        await asyncio.sleep(0.2)
        if await asyncio.to_thread(_tree_size, workspace, cap) > cap:
            on_exceeded()
            return


def _new_home() -> str:
    """A private HOME for a run that cannot have one in its own /tmp; stale ones of dead servers are removed."""
    return str(new_scratch("flowllm-sandbox-home-"))


def _tmp_mb(limits: SandboxLimits) -> int:
    """The size of the sandbox's private ``/tmp`` (and ``/dev/shm``) in MB."""
    return max(16, min(limits.max_file_mb or 256, 1024))


def _bootstrap_config(
    limits: SandboxLimits,
    workspace: Path,
    home: str,
    cgroup_procs: list[str],
    report_fd: int,
    *,
    bwrap: bool,
    gaps: list[str],
) -> str:
    return json.dumps(
        {
            "memory_mb": limits.memory_mb,
            "cpu_s": cpu_seconds(limits),
            "fsize_mb": limits.max_file_mb,
            "max_processes": limits.max_processes,
            "allow_network": limits.allow_network,
            "required": limits.isolation is Isolation.REQUIRED,
            "parent": os.getpid(),
            "workspace": str(workspace),
            "home": home,
            "uid": sandbox_uid(),
            "ro_paths": python_paths(),
            "new_root": tempfile.gettempdir(),
            "tmp_mb": _tmp_mb(limits),
            "cgroup_procs": cgroup_procs,
            "python_traversable": all(traversable_by_others(p) for p in (sys.prefix, sys.base_prefix)),
            "report": report_fd,
            "bwrap": bwrap,  # bubblewrap isolated the bootstrap already: it only drops privileges and sets limits
            "gaps": gaps,
            "env": sorted(child_env(home)),  # the names the code's environment may hold
        }
    )


# Joins the call's cgroup, then becomes bwrap (same pid, so bwrap and all it starts are in the group): the
# sandbox cannot do it itself, as /sys is not visible inside. Its arguments: the ``cgroup.procs`` files, ``--``,
# then the command. Where joining fails it tells the bootstrap so with one more argument, ``cgroup``.
_JOIN_CGROUP = (
    'joined=yes; while [ "$1" != -- ]; do { echo $$ > "$1"; } 2>/dev/null || joined=no; shift; done; shift; '
    '[ "$joined" = yes ] || set -- "$@" cgroup; exec "$@"'
)


def _bwrap_command(
    probe: BwrapProbe, limits: SandboxLimits, workspace: str, home: str | None, as_root: bool
) -> list[str]:
    mounts = workspace_mounts(workspace, home, _tmp_mb(limits) * 1024 * 1024)
    return bwrap_command(probe, mounts, as_root=as_root, allow_network=limits.allow_network)


def _choose_backend(requested: SandboxBackend, as_root: bool) -> tuple[SandboxBackend, BwrapProbe | None, list[str]]:
    """The backend a call runs under, the bwrap it uses, and the gaps the choice itself leaves."""
    if requested is SandboxBackend.NAMESPACES or (requested is SandboxBackend.AUTO and as_root):
        return SandboxBackend.NAMESPACES, None, []
    probe = probe_bwrap()
    if probe.path is not None:
        return SandboxBackend.BWRAP, probe, []
    return SandboxBackend.NAMESPACES, None, ["bwrap"] if requested is SandboxBackend.BWRAP else []


def _bwrap_exit_code(code: int | None) -> int | None:
    """bwrap reports a command killed by signal N as exit status 128 + N; the result speaks of signals as
    negative codes. Code that itself exits with such a status (``sys.exit(137)``) reads as the signal too: rare,
    and it changes only the status line."""
    if code is not None and 128 < code < 128 + signal.NSIG:
        return -(code - 128)
    return code


@dataclass
class _Launch:
    """A prepared run of the sandbox: its command line, home, cgroup and the pipe the bootstrap reports on."""

    args: list[str]
    home: str
    own_home: str | None  # a fresh home folder made on the host: removed afterwards
    group: cgroup.Cgroup | None
    report_read: int
    report_write: int
    backend: SandboxBackend
    use_bwrap: bool


async def _prepare(limits: SandboxLimits, workspace: Path, home: str | None) -> _Launch:
    """The backend chosen, the home folder and cgroup made, the workspace handed over, the command built."""
    as_root = hasattr(os, "getuid") and os.getuid() == 0
    backend, probe, gaps_known = await asyncio.to_thread(_choose_backend, limits.backend, as_root)
    use_bwrap = probe is not None
    own_home = None
    home_bind = home
    if home is None:
        if as_root or use_bwrap:
            home = SANDBOX_HOME  # inside the sandbox's private /tmp: nothing to clean up on the host
        else:
            own_home = home = _new_home()
    group = None
    if sys.platform.startswith("linux"):
        name = f"{time.monotonic_ns()}"
        group = await asyncio.to_thread(cgroup.create, name, limits.memory_mb * 1024 * 1024, limits.max_processes + 8)
    if group is None and (limits.memory_mb or limits.max_processes):
        # Told to the bootstrap, so that required isolation refuses to run without the cgroup too.
        gaps_known.append("cgroup")
    if as_root:
        await asyncio.to_thread(_own_workspace, workspace, sandbox_uid())
    report_read, report_write = os.pipe()
    procs = group.procs_files if group else []
    config = _bootstrap_config(
        limits, workspace, home, [] if use_bwrap else procs, report_write, bwrap=use_bwrap, gaps=gaps_known
    )
    args = [sys.executable, "-P", "-X", "utf8", "-c", program("sandbox_boot"), config]
    if probe is not None:
        args = [*_bwrap_command(probe, limits, str(workspace), home_bind, as_root), *args]
        if procs:
            args = ["/bin/sh", "-c", _JOIN_CGROUP, "sh", *procs, "--", *args]
    return _Launch(args, home, own_home, group, report_read, report_write, backend, use_bwrap)


async def _start(launch: _Launch, workspace: Path) -> asyncio.subprocess.Process:
    """The sandbox's process; if it cannot start, the pipe is closed and the cgroup removed."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *launch.args,
            cwd=str(workspace),
            env=child_env(launch.home),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=(launch.report_write,),
        )
    except BaseException:
        os.close(launch.report_read)
        os.close(launch.report_write)
        if launch.group is not None:
            await asyncio.to_thread(launch.group.remove)
        raise
    os.close(launch.report_write)
    return proc


async def _supervise(
    proc: asyncio.subprocess.Process,
    code: str,
    limits: SandboxLimits,
    workspace: Path,
    group: cgroup.Cgroup | None,
    out: StreamCapture,
    err: StreamCapture,
) -> tuple[bool, bool]:
    """Feeds the code in, waits for the end or the time limit, and leaves no process of it alive; returns
    (timed out, workspace limit exceeded)."""
    timed_out = False
    exceeded = False

    def stop_for_size() -> None:
        nonlocal exceeded
        exceeded = True
        kill_all(proc.pid, group)

    watcher = None
    try:
        pumps = asyncio.gather(_pump(proc.stdout, out), _pump(proc.stderr, err))
        if limits.max_workspace_mb > 0:
            watcher = asyncio.create_task(_watch_workspace(workspace, limits.max_workspace_mb, stop_for_size))
        try:
            assert proc.stdin is not None
            proc.stdin.write(code.encode("utf-8", errors="surrogatepass"))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await proc.stdin.drain()
            proc.stdin.close()
            timed_out = not await wait_exit(proc, limits.timeout_s)
            # Kill everything in every case: the code may have left background children holding our pipes.
            kill_all(proc.pid, group)
            # All are dead, so the pipes reach EOF unless a grandchild escaped (no cgroup, no PID namespace).
            try:
                await asyncio.wait_for(asyncio.shield(pumps), timeout=2.0)
            except TimeoutError:
                pumps.cancel()
            await wait_exit(proc, 5.0)
        except BaseException:
            pumps.cancel()
            raise
    finally:
        if watcher is not None:
            watcher.cancel()
        kill_all(proc.pid, group)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    return timed_out, exceeded


async def run_python_code(
    code: str, workspace: Path, limits: SandboxLimits | None = None, *, home: str | None = None
) -> SandboxResult:
    """Run ``code`` with ``workspace`` as the working directory under ``limits``.

    ``home``: a host folder to use as ``HOME`` (bound read-write under bubblewrap); by default a fresh one.
    Never raises for problems of the code itself (syntax errors, exceptions, timeouts, limits): those are in
    the result. ``asyncio.CancelledError`` propagates after every process the code started has been killed.
    """
    limits = limits or SandboxLimits()
    workspace = workspace.resolve()
    launch = await _prepare(limits, workspace, home)
    out, err = StreamCapture(limits.max_stdout_chars), StreamCapture(limits.max_stderr_chars)
    proc = await _start(launch, workspace)
    group = launch.group
    try:
        timed_out, exceeded = await _supervise(proc, code, limits, workspace, group, out, err)
    finally:
        if group is not None:
            await asyncio.shield(asyncio.to_thread(group.remove))
        gaps = _read_report(launch.report_read)
        if launch.own_home is not None:
            remove_tree(launch.own_home)

    spellings = workspace_spellings(workspace)
    stdout_text, stdout_cut = out.text()
    stderr_text, stderr_cut = err.text()
    if gaps is not None and group is None and "cgroup" not in gaps and (limits.memory_mb or limits.max_processes):
        gaps.append("cgroup")
    return SandboxResult(
        stdout=scrub_workspace(stdout_text, spellings),
        stderr=scrub_workspace(stderr_text, spellings),
        exit_code=None if timed_out else _bwrap_exit_code(proc.returncode) if launch.use_bwrap else proc.returncode,
        timed_out=timed_out and not exceeded,
        stdout_cut=stdout_cut,
        stderr_cut=stderr_cut,
        limits=limits,
        workspace_exceeded=exceeded,
        gaps=gaps,
        backend=launch.backend,
    )


def _read_report(fd: int) -> list[str] | None:
    try:
        os.set_blocking(fd, False)
        data = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(fd, 65536):
                data += chunk
    finally:
        os.close(fd)
    try:
        report = json.loads(data)
    except ValueError:
        return None
    gaps = report.get("gaps") if isinstance(report, dict) else None
    return [str(g) for g in gaps] if isinstance(gaps, list) else None
