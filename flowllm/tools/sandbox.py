"""Run model-written Python in a child process that can reach nothing but its task's folder.

The code is hostile until proven otherwise: it may look for API keys, for the benchmark's answers, for other
tasks' results, or try to outlive its call. As root (the usual case in a container) one run goes:

* A fresh interpreter starts with ``-P`` (nothing prepended to ``sys.path``, so a ``socket.py`` among the
  task's files cannot hijack the bootstrap) in its own session, with an environment built from a fixed
  allowlist (``child_env``): no variable of ours, so no key, reaches it.
* The bootstrap (``_BOOTSTRAP`` below) joins the call's cgroup (``flowllm.tools.cgroup``: one memory budget and
  one process cap for the code and all its children), then unshares the mount, PID, IPC, UTS and network
  namespaces and builds a new root on a tmpfs: the system folders and the Python install read-only, the
  workspace read-write at its own path, a private size-capped ``/tmp`` (``HOME`` lives there) and a minimal
  ``/dev``. The run directory, the dataset, the project and other tasks are simply not there.
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

When flowllm is not root, bubblewrap (``bwrap``) builds the same sandbox instead (``SandboxBackend``: AUTO
picks it, BWRAP forces it, as root too): new PID, mount, IPC, UTS and network namespaces (and, not root, a user
namespace), the same read-only system folders and Python install, the workspace as the one writable folder, a
private size-capped ``/tmp`` and ``/dev/shm``, a fresh ``/proc``, a minimal read-only ``/dev``,
``--die-with-parent`` and ``--new-session``. The same bootstrap runs inside it, told it is isolated already: it
only sets ``PR_SET_PDEATHSIG``, no-new-privs and the limits (and, as root, drops to ``sandbox_uid``). The
cgroup, where one can be made, is joined by a shell that then becomes bwrap, since ``/sys`` is not visible
inside. Not root, the code keeps flowllm's uid inside a user namespace of its own: it reaches no file but what
is bound in and no process outside, and its ``RLIMIT_NPROC`` counts only its own processes (Linux >= 5.14
counts per uid and user namespace). Without a delegated cgroup, memory is limited per process
(``RLIMIT_AS``): the gap "cgroup". Whether bwrap works is probed once per process (``probe_bwrap``).

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
import enum
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flowllm.tools import cgroup
from flowllm.tools.common import scrub_workspace, workspace_spellings

SCRIPT_NAME = "<run_python>"
UID_BASE = 1_000_000  # sandbox uids are UID_BASE + the tool server's pid: far above any real account
SANDBOX_HOME = "/tmp/.home"
REFUSED_EXIT = 126  # the bootstrap's exit status when isolation is required and missing
_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

# Sets one resource limit (soft = hard, never above the hard limit already in force), for the programs that run
# in a sandbox before anything else is imported (this bootstrap and the document reader's worker).
CHILD_LIMIT = r"""
def _limit(kind, value):
    import resource
    try:
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass
"""

# Runs inside the child before the user's code. Kept free of flowllm imports: the child must not need them.
# Its one argument is a JSON object (see ``_bootstrap_config``); what isolation it achieved goes, as JSON, to
# the pipe whose fd is CFG["report"].
_BOOTSTRAP = (
    r"""
import json, os, sys

CFG = json.loads(sys.argv[1])
NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
REPORT = {"gaps": list(CFG["gaps"])}  # what the server already knows is missing (no cgroup, no bwrap)

def _libc():
    import ctypes
    return ctypes.CDLL(None, use_errno=True)

def _check(rc, what):
    if rc != 0:
        import ctypes
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")

def _mount(src, target, fstype, flags, data=None):
    enc = lambda v: v.encode() if v is not None else None
    _check(_libc().mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")

"""
    + CHILD_LIMIT
    + r"""
def _pdeathsig():
    import signal
    _libc().prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: die with the process that started us

def _join_cgroup():
    for procs in CFG["cgroup_procs"]:
        try:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
        except OSError:
            REPORT["gaps"].append("cgroup")
            return

def _guard_sockets():
    import socket
    def _refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in run_python")
    for name in ("connect", "connect_ex", "sendto", "sendmsg", "bind"):
        setattr(socket.socket, name, _refuse)
    socket.getaddrinfo = _refuse
    socket.create_connection = _refuse

def _unprivileged_network():
    # Not root: a user namespace of our own lets us cut the network (and nothing else).
    uid, gid = os.getuid(), os.getgid()
    if _libc().unshare(NEWUSER | NEWNET) == 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            try:
                with open(f"/proc/self/{name}", "w") as fh:
                    fh.write(text)
            except OSError:
                pass
        return True
    return False

def _build_root():
    # As root: a private mount namespace whose root is a fresh tmpfs holding only the system folders and the
    # Python install (read-only), the workspace (read-write), a private /tmp and a minimal /dev.
    flags = NEWNS | NEWPID | NEWIPC | NEWUTS | (0 if CFG["allow_network"] else NEWNET)
    _check(_libc().unshare(flags), "unshare")
    _mount(None, "/", None, REC | PRIVATE)
    sources = {}
    for path in CFG["ro_paths"]:
        if os.path.exists(path):
            sources[path] = (os.open(path, os.O_PATH), True)
    sources[CFG["workspace"]] = (os.open(CFG["workspace"], os.O_PATH | os.O_DIRECTORY), False)
    devices = [d for d in ("null", "zero", "full", "random", "urandom") if os.path.exists(f"/dev/{d}")]
    for dev in devices:
        sources[f"/dev/{dev}"] = (os.open(f"/dev/{dev}", os.O_PATH), False)
    root = CFG["new_root"]
    _mount("tmpfs", root, "tmpfs", NOSUID | NODEV, "size=1m,mode=0755")
    for sub in ("proc", "dev", "tmp"):
        os.makedirs(root + "/" + sub, exist_ok=True)
    _mount("tmpfs", root + "/tmp", "tmpfs", NOSUID | NODEV, f"size={CFG['tmp_mb']}m,mode=1777")
    os.makedirs(root + "/dev/shm", exist_ok=True)
    _mount("tmpfs", root + "/dev/shm", "tmpfs", NOSUID | NODEV, f"size={CFG['tmp_mb']}m,mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    for path in sorted(sources):
        fd, read_only = sources[path]
        target = root + path
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        _mount(f"/proc/self/fd/{fd}", target, None, BIND | REC)
        if read_only:
            _mount(None, target, None, BIND | REMOUNT | RDONLY | NOSUID | NODEV)
        os.close(fd)
    os.makedirs(root + CFG["home"], exist_ok=True)
    os.chmod(root + CFG["home"], 0o777)

def _drop_privileges():
    uid = CFG["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _libc().prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid binary gives root back

def _wait_and_mirror(pid):
    # The outer process waits for the namespace's first process and leaves the way it did.
    import resource, signal
    os.close(CFG["report"]) if CFG["report"] else None
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)

def _inside_bwrap():
    # bubblewrap built the namespaces and the new root already. Our parent is its process 1 inside the PID
    # namespace, not the server, so the check on the parent's pid does not apply: --die-with-parent ties bwrap
    # to the server, and when bwrap's process 1 dies the kernel kills everything in the namespace.
    if "cgroup" in sys.argv[2:]:  # the wrapper that started bwrap could not join the call's cgroup
        REPORT["gaps"].append("cgroup")
    for name in set(os.environ) - set(CFG["env"]):  # PWD, which bwrap sets for --chdir (and a shell's own)
        del os.environ[name]
    if os.getuid() == 0:
        # Root's bwrap makes no user namespace (one would map the code's uid to root outside), so we are still
        # root here: drop to the server's own uid, as the namespace path does.
        _drop_privileges()
        _pdeathsig()  # a change of credentials clears it
    else:
        _libc().prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS (bwrap sets it too; this does not rely on that)

def _isolate():
    if not sys.platform.startswith("linux"):
        REPORT["gaps"] += ["namespaces", "privileges"]
        return
    _pdeathsig()
    if CFG["bwrap"]:
        _inside_bwrap()
        return
    if os.getppid() != CFG["parent"]:  # the server died before prctl took effect
        os._exit(137)
    _join_cgroup()
    if os.getuid() != 0:
        REPORT["gaps"] += ["privileges", "filesystem", "pid namespace"]
        if not CFG["allow_network"] and not _unprivileged_network():
            REPORT["gaps"].append("network namespace")
            _guard_sockets()
        return
    try:
        _build_root()
    except OSError as exc:
        REPORT["gaps"] += ["filesystem", "pid namespace"]
        REPORT["error"] = str(exc)
        if not CFG["allow_network"] and _libc().unshare(NEWNET) != 0:
            REPORT["gaps"].append("network namespace")
            _guard_sockets()
        if CFG["python_traversable"]:
            _drop_privileges()
            _pdeathsig()
        else:
            REPORT["gaps"].append("privileges")
        return
    pid = os.fork()
    if pid:
        _wait_and_mirror(pid)
    # The first process of the new PID namespace: when it dies, the kernel kills everything the code started.
    _mount("proc", CFG["new_root"] + "/proc", "proc", NOSUID | NODEV | NOEXEC)
    _mount(None, CFG["new_root"], None, REMOUNT | RDONLY | NOSUID | NODEV)
    os.chroot(CFG["new_root"])
    _drop_privileges()
    _pdeathsig()  # a change of credentials clears it

def _setup():
    _isolate()
    os.chdir(CFG["workspace"])
    import resource
    if CFG["memory_mb"] > 0:
        _limit(resource.RLIMIT_AS, CFG["memory_mb"] * 1024 * 1024)
    if CFG["cpu_s"] > 0:
        _limit(resource.RLIMIT_CPU, CFG["cpu_s"])
    if CFG["fsize_mb"] > 0:
        _limit(resource.RLIMIT_FSIZE, CFG["fsize_mb"] * 1024 * 1024)
    if CFG["max_processes"] > 0 and os.getuid() != 0:  # root is exempt from the cap, so it means nothing there
        _limit(resource.RLIMIT_NPROC, CFG["max_processes"])
    _limit(resource.RLIMIT_CORE, 0)
    if CFG["report"]:
        REPORT["uid"] = os.getuid()
        try:
            os.write(CFG["report"], json.dumps(REPORT).encode())
        finally:
            os.close(CFG["report"])
    if CFG["required"] and REPORT["gaps"]:
        missing = ", ".join(REPORT["gaps"])
        sys.stderr.write(f"run_python refuses to run without full isolation; missing: {missing}\n")
        os._exit(126)

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
)


class Isolation(enum.Enum):
    """How hard ``run_python`` insists on its isolation."""

    BEST = "best"  # isolate as far as this machine allows; say once what is missing
    REQUIRED = "required"  # refuse to run code when any part is missing


class SandboxBackend(enum.Enum):
    """What builds the sandbox (``--sandbox-backend``)."""

    # As root: our own namespaces (the stronger choice: a uid of the server's own and a cgroup). Not root:
    # bubblewrap where it works here, else the fallback with its gaps.
    AUTO = "auto"
    # bubblewrap, as root too; where it cannot run, the fallback runs and the result reports the gap "bwrap".
    BWRAP = "bwrap"
    # Our own namespaces as root; not root, the fallback (no private filesystem, no PID namespace).
    NAMESPACES = "namespaces"


# What a call's sandbox lacks, in words a user can act on (the keys are what the bootstrap reports).
GAP_TEXT = {
    "privileges": "the code runs as flowllm's own user and can read what flowllm can, /proc included",
    "filesystem": "the code sees the whole filesystem (run directory, dataset, project)",
    "pid namespace": "the code sees and can signal other processes of its user",
    "network namespace": "the network is cut only by a guard on Python's socket module",
    "cgroup": "no cgroup could be made: memory is limited per process (RLIMIT_AS), not for the code and its "
    "children together, and the process cap is a per-user RLIMIT_NPROC",
    "bwrap": "the bubblewrap backend was asked for but cannot run here, so the fallback ran",
    "namespaces": "no namespaces outside Linux",
}
# Said once after the gaps it closes (the fallback's, when flowllm is not root and bwrap cannot run).
BWRAP_CLOSES = ("privileges", "filesystem", "pid namespace")
BWRAP_HINT = (
    "installing bubblewrap (bwrap, with user namespaces allowed) closes the gaps in privileges, files and processes"
)


@dataclass
class SandboxLimits:
    """Limits of one ``run_python`` call; ``0`` switches a resource limit off."""

    timeout_s: float = 30.0
    memory_mb: int = 2048  # per process (RLIMIT_AS) and, where a cgroup can be made, for all of them together
    max_file_mb: int = 512  # largest single file (RLIMIT_FSIZE); also the private /tmp's size
    max_workspace_mb: int = 1024  # what the workspace may grow to during a call before the code is stopped
    max_processes: int = 64  # processes and threads of the code together
    allow_network: bool = False
    isolation: Isolation = Isolation.BEST
    backend: SandboxBackend = SandboxBackend.AUTO
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
    workspace_exceeded: bool = False
    # What the bootstrap could not set up on this machine (keys of GAP_TEXT); None if it did not say.
    gaps: list[str] | None = None
    # What built the sandbox of this call: BWRAP or NAMESPACES (the latter also names the fallback), never AUTO.
    backend: SandboxBackend | None = None

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
        if self.workspace_exceeded:
            return (
                f"[stopped: the task folder grew past {lim.max_workspace_mb} MB; "
                "delete what is not needed or write less]"
            )
        if self.timed_out:
            return (
                f"[timed out: the code was still running after {lim.timeout_s:g} s and was stopped; "
                "output printed before that is shown above]"
            )
        code = self.exit_code
        if code is None or code == 0:
            return ""
        if code == REFUSED_EXIT and self.gaps:
            return "[not run: the sandbox's isolation is required but missing here: " + ", ".join(self.gaps) + "]"
        if code < 0:
            sig = -code
            if sig == signal.SIGXCPU:
                return f"[stopped: the CPU time limit ({_cpu_seconds(lim)} s) was reached]"
            if sig == signal.SIGXFSZ:
                return f"[stopped: a file reached the size limit of {lim.max_file_mb} MB]"
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


def child_env(home: str) -> dict[str, str]:
    """The code's whole environment: a fixed allowlist, never a copy of ours (no key or token can pass)."""
    return {
        "PATH": _SAFE_PATH,
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
        # pyarrow (imported by pandas) reserves about 1 GB of address space for its own allocator; under the
        # RLIMIT_AS cap that alone leaves little for the code: the system allocator reserves what it uses.
        "ARROW_DEFAULT_MEMORY_POOL": "system",
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


def sandbox_uid() -> int:
    """The unprivileged uid this tool server's code runs as (when we are root): one per live server.

    A uid of its own, not ``nobody``: concurrent tasks' code cannot signal, trace or read each other, and the
    process cap (``RLIMIT_NPROC`` counts per uid) is this server's alone. Pids are unique among live
    processes, so are these uids; no account needs to exist for them.
    """
    return UID_BASE + os.getpid()


def python_paths() -> list[str]:
    """The folders the interpreter and its packages live in: read-only in the sandbox, everything else hidden."""
    import site
    import sysconfig

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            paths.add(sysconfig.get_paths()[key])
    paths.update(site.getsitepackages())
    found = sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)} | set(_SYSTEM_PATHS))
    # A folder inside another one on the list is already there.
    kept: list[str] = []
    for path in found:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _traversable_by_others(path: str) -> bool:
    """Whether a user with no rights of its own can reach ``path`` (every folder up to it is world-x)."""
    current = os.path.realpath(path)
    while True:
        try:
            if not os.stat(current).st_mode & 0o001:
                return False
        except OSError:
            return False
        parent = os.path.dirname(current)
        if parent == current:
            return True
        current = parent


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
    base = tempfile.gettempdir()
    prefix = "flowllm-sandbox-home-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            owner = entry.name[len(prefix) :].split("-", 1)[0] if entry.name.startswith(prefix) else ""
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                _remove_tree(entry.path)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


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
            "cpu_s": _cpu_seconds(limits),
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
            "python_traversable": all(_traversable_by_others(p) for p in (sys.prefix, sys.base_prefix)),
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


@dataclass(frozen=True)
class BwrapProbe:
    """Whether bubblewrap can build the sandbox here: ``path`` is the binary when it can, else ``problem`` says why."""

    path: str | None
    problem: str = ""
    disable_userns: bool = False  # whether this bwrap can forbid the code new user namespaces (bwrap >= 0.8)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _bwrap_namespaces(as_root: bool, allow_network: bool, disable_userns: bool) -> list[str]:
    args = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if not allow_network:
        args.append("--unshare-net")
    if not as_root:
        # Without privileges bwrap needs a user namespace to build anything, and the code keeps flowllm's uid,
        # mapped to itself. That is not reported as the gap "privileges", which is about what the uid reaches:
        # here no file but what is bound in (all read-only but the workspace), no process outside the PID
        # namespace (none to signal or trace, no other /proc/<pid>/environ), no abstract socket outside the
        # network namespace (unless the network is allowed). What the shared uid still gives: bound files only
        # flowllm's user may read (its Python install) are readable, as the code needs them anyway.
        # RLIMIT_NPROC counts per uid *and user namespace* (Linux >= 5.14), so the cap holds this call alone;
        # an older kernel counts all of the user's processes, flowllm's own included.
        # As root there is no user namespace: bwrap would map the code's uid to root outside, which owns the
        # read-only system files (and their owner bits); the bootstrap drops to the server's own uid instead.
        args.append("--unshare-user")
        if disable_userns:
            args.append("--disable-userns")  # fewer kernel paths within reach of the code
    return args


def bwrap_mounts(
    tmp_bytes: int,
    *,
    chdir: str,
    writable: tuple[str, ...] = (),
    read_only: tuple[tuple[str, str], ...] = (),
    home: str | None = None,
) -> list[str]:
    """bwrap's view of the filesystem: the system folders and the Python install read-only, ``read_only``'s
    ``(host path, path inside)`` pairs read-only, ``writable`` read-write at their own paths, a private
    size-capped ``/tmp`` and ``/dev/shm``, a fresh ``/proc``, a minimal ``/dev``; nothing else exists (the run
    directory, the dataset, the project, other tasks). ``home``: a host folder bound as ``HOME`` (list it in
    ``writable`` too); ``None`` makes ``SANDBOX_HOME`` inside the private ``/tmp``."""
    args: list[str] = []
    made = {"/", "/proc", "/dev", "/tmp"}  # folders of the new root that exist once the first mounts are made
    host_trees: list[str] = []  # bound host folders: whatever lies below them is there already

    def parents(path: str) -> None:
        # bwrap creates missing parents with mode 0700, which the server's uid (as root) could not cross.
        for parent in reversed(Path(path).parents):
            text = str(parent)
            if text not in made and not any(_inside(text, tree) for tree in host_trees):
                args.extend(["--perms", "0755", "--dir", text])
                made.add(text)

    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/dev/shm"]
    args += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    if home is None:
        parents(SANDBOX_HOME)
        args += ["--perms", "0777", "--dir", SANDBOX_HOME]  # 0777: as root, the code's uid does not own it
    # The host's root is never bound, even were it on the list: that would undo the sandbox.
    paths = [p for p in python_paths() if p != "/" and os.path.lexists(p)]
    folders = [p for p in paths if not os.path.islink(p)]
    for path in folders:
        parents(path)
        args += ["--ro-bind", path, path]
        host_trees.append(path)
    for path in (p for p in paths if os.path.islink(p)):
        parents(path)
        if any(_inside(os.path.realpath(path), folder) for folder in folders):
            args += ["--symlink", os.readlink(path), path]  # /lib -> usr/lib stays a link, as on the host
        else:
            args += ["--ro-bind", path, path]
            host_trees.append(path)
    for source, target in read_only:
        parents(target)
        args += ["--ro-bind", source, target]
        host_trees.append(target)
    for folder in writable:
        parents(folder)
        args += ["--bind", folder, folder]
    # The new root and /dev are tmpfs folders bwrap made; read-only, the code can fill neither.
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", chdir]
    return args


def _bwrap_mounts(workspace: str, home: str | None, tmp_bytes: int) -> list[str]:
    """run_python's view: the workspace (and a given ``home``) read-write, the working directory the workspace."""
    writable = (workspace,) if home is None else (workspace, home)
    return bwrap_mounts(tmp_bytes, chdir=workspace, writable=writable, home=home)


def bwrap_command(
    probe: BwrapProbe, mounts: list[str], *, as_root: bool, allow_network: bool, options: tuple[str, ...] = ()
) -> list[str]:
    """The bwrap command line up to ``--``: new namespaces (see ``_bwrap_namespaces``), ``options`` (e.g.
    capabilities to drop), death with the server, a session of its own, then ``mounts`` (``bwrap_mounts``)."""
    assert probe.path is not None
    return [
        probe.path,
        *_bwrap_namespaces(as_root, allow_network, probe.disable_userns),
        *options,
        "--die-with-parent",  # the sandbox dies with the server, even a server killed with SIGKILL
        "--new-session",  # no controlling terminal to push input into (TIOCSTI)
        *mounts,
        "--",
    ]


def _bwrap_command(
    probe: BwrapProbe, limits: SandboxLimits, workspace: str, home: str | None, as_root: bool
) -> list[str]:
    mounts = _bwrap_mounts(workspace, home, _tmp_mb(limits) * 1024 * 1024)
    return bwrap_command(probe, mounts, as_root=as_root, allow_network=limits.allow_network)


@functools.cache
def probe_bwrap() -> BwrapProbe:
    """Whether bubblewrap works on this machine, found by running it once with the namespaces and mounts of a
    call (``true`` in place of the code). Cached for the process: the answer does not change while it runs."""
    if not sys.platform.startswith("linux"):
        return BwrapProbe(None, "bubblewrap needs Linux")
    path = shutil.which("bwrap", path=os.pathsep.join([os.environ.get("PATH", ""), _SAFE_PATH]))
    if path is None:
        return BwrapProbe(None, "bwrap is not installed (the package is called bubblewrap)")
    true = shutil.which("true", path=_SAFE_PATH)
    if true is None:
        return BwrapProbe(None, "no `true` command to try bwrap with")
    as_root = os.getuid() == 0
    folder = tempfile.mkdtemp(prefix="flowllm-bwrap-probe-")
    problem = ""
    try:
        # --disable-userns (bwrap >= 0.8) hardens a sandbox that holds without it: an older bwrap is used without.
        for disable_userns in (False,) if as_root else (True, False):
            probe = BwrapProbe(path, disable_userns=disable_userns)
            command = [*_bwrap_command(probe, SandboxLimits(max_file_mb=16), folder, None, as_root), true]
            try:
                done = subprocess.run(
                    command, stdin=subprocess.DEVNULL, capture_output=True, env={"PATH": _SAFE_PATH}, timeout=30
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return BwrapProbe(None, f"{path} could not run: {exc}")
            if done.returncode == 0:
                return probe
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            problem = lines[-1] if lines else f"exit status {done.returncode}"
    finally:
        _remove_tree(folder)
    return BwrapProbe(None, f"{path} cannot build the sandbox here: {problem}")


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
    args = [sys.executable, "-P", "-X", "utf8", "-c", _BOOTSTRAP, config]
    if probe is not None:
        args = [*_bwrap_command(probe, limits, str(workspace), home_bind, as_root), *args]
        if procs:
            args = ["/bin/sh", "-c", _JOIN_CGROUP, "sh", *procs, "--", *args]
    out, err = _Capture(limits.max_stdout_chars), _Capture(limits.max_stderr_chars)
    timed_out = False
    exceeded = False
    try:
        proc = await asyncio.create_subprocess_exec(
            *args,
            cwd=str(workspace),
            env=child_env(home),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=(report_write,),
        )
    except BaseException:
        os.close(report_read)
        os.close(report_write)
        if group is not None:
            await asyncio.to_thread(group.remove)
        raise
    os.close(report_write)

    def stop_for_size() -> None:
        nonlocal exceeded
        exceeded = True
        _kill_all(proc.pid, group)

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
            timed_out = not await _wait_exit(proc, limits.timeout_s)
            # Kill everything in every case: the code may have left background children holding our pipes.
            _kill_all(proc.pid, group)
            # All are dead, so the pipes reach EOF unless a grandchild escaped (no cgroup, no PID namespace).
            try:
                await asyncio.wait_for(asyncio.shield(pumps), timeout=2.0)
            except TimeoutError:
                pumps.cancel()
            await _wait_exit(proc, 5.0)
        except BaseException:
            pumps.cancel()
            raise
    finally:
        if watcher is not None:
            watcher.cancel()
        _kill_all(proc.pid, group)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if group is not None:
            await asyncio.shield(asyncio.to_thread(group.remove))
        gaps = _read_report(report_read)
        if own_home is not None:
            _remove_tree(own_home)

    spellings = workspace_spellings(workspace)
    stdout_text, stdout_cut = out.text()
    stderr_text, stderr_cut = err.text()
    if gaps is not None and group is None and "cgroup" not in gaps and (limits.memory_mb or limits.max_processes):
        gaps.append("cgroup")
    return SandboxResult(
        stdout=scrub_workspace(stdout_text, spellings),
        stderr=scrub_workspace(stderr_text, spellings),
        exit_code=None if timed_out else _bwrap_exit_code(proc.returncode) if use_bwrap else proc.returncode,
        timed_out=timed_out and not exceeded,
        stdout_cut=stdout_cut,
        stderr_cut=stderr_cut,
        limits=limits,
        workspace_exceeded=exceeded,
        gaps=gaps,
        backend=backend,
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


def _kill_all(pid: int, group: cgroup.Cgroup | None) -> None:
    """Kill the code's session and, where there is one, its cgroup (which holds the children that left it)."""
    _kill_group(pid)
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


def describe_gaps(gaps: list[str]) -> str:
    """One line for a user: what this machine's sandbox lacks and what that means."""
    parts = [GAP_TEXT.get(gap, gap) for gap in gaps]
    if any(gap in BWRAP_CLOSES for gap in gaps):
        parts.append(BWRAP_HINT)
    if "bwrap" in gaps:  # the probe ran in this process to report the gap, so its answer is cached
        parts.append(f"bubblewrap: {probe_bwrap().problem}")
    return "; ".join(parts)


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
