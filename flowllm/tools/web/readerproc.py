"""Document readers in a process of their own, under a memory cap and a time budget, sandboxed where possible.

markitdown's readers (pdfminer, openpyxl, python-docx...) parse untrusted files: a crafted PDF can spin for
minutes and a decompression bomb can take gigabytes. A thread cannot be stopped, so tool-files and tool-browse
run them in warm worker processes of their own (``ReaderProcess``): each one's address space is capped
(``RLIMIT_AS``), a call that overruns its budget gets the worker killed (and a new one started for the next
call), and either failure comes back as a ``DocumentError`` the model reads, never as a hung or dead server.

A parser exploited by a crafted file must not get the server's view of the machine either. Where bubblewrap
works (``flowllm.tools.sandbox.isolation.probe_bwrap``) each worker is a long-lived interpreter started under it
(``_IsolatedWorker``): new PID, IPC, UTS and network namespaces (and a user namespace when not root), the system
folders and the Python install read-only, the ``flowllm`` package read-only at a neutral path, a private capped
``/tmp``, a fresh ``/proc`` and a minimal ``/dev``; no workspace, no project, no other host folder. Its
environment is a fixed allowlist. As root, bwrap keeps only the capabilities to change uid, and the worker drops
to the server's sandbox uid (``sandbox_uid``) before it imports anything; it then sets ``PR_SET_NO_NEW_PRIVS``
and its limits. The parsers get the document's bytes over a pipe, never a path.

The protocol is one-sided in trust: requests (server -> worker) are length-prefixed pickles of
``(function, args, kwargs)``, as the worker trusts the server; replies (worker -> server) are length-prefixed
JSON, which the server parses without running anything a compromised parser could have put there. A reply that
is not valid ends that worker like a crash does. Where bubblewrap cannot run, the worker is a plain capped
process (``_Worker``) and ``ReaderProcess.isolated`` is False; the servers say so once on stderr.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import os
import pickle
import queue
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import flowllm
from flowllm.tools.child import program
from flowllm.tools.sandbox.isolation import (
    SANDBOX_HOME,
    BwrapProbe,
    bwrap_command,
    bwrap_mounts,
    child_env,
    probe_bwrap,
    python_paths,
    sandbox_uid,
)
from flowllm.tools.web.documents import DocumentError

T = TypeVar("T")

# Where the flowllm package is bound inside the sandbox: a neutral path, so that neither an editable install's
# project folder nor the server's own paths are visible (or needed) there.
PACKAGE_ROOT_INSIDE = "/opt/flowllm"
_TMP_BYTES = 64 * 1024 * 1024  # the private /tmp (and /dev/shm); also the largest file a parser may write
_MAX_PROCESSES = 32  # the workers' uid (RLIMIT_NPROC): parsers start no process, a fork bomb stops here
_MAX_REPLY_BYTES = 256 * 1024 * 1024  # a larger reply is refused before it is read: a lying length header
_MAX_MESSAGE_CHARS = 4000  # of an error message from a worker, which a hostile file may have written
_START_TIMEOUT_S = 120.0  # a worker's start (bwrap, the interpreter, markitdown's import): not the call's budget
_CHUNK = 1024 * 1024

TIMEOUT_TEXT = "reading it took longer than {timeout:g} s and was stopped"
MEMORY_TEXT = "reading it needs more than the reader's {memory:,} MB of memory"
CRASHED_TEXT = "the document reader crashed on it (a corrupt or hostile file)"
INVALID_TEXT = "the document reader sent back a reply that is not valid (a corrupt or hostile file)"
FAILED_TEXT = "the document reader failed on it ({detail})"
NOT_STARTED_TEXT = "the document reader could not be started ({detail}); the server's log may say more"


@dataclass(frozen=True)
class ReaderLimits:
    memory_mb: int = 1536  # the worker's whole address space; 0: no cap
    timeout_s: float = 45.0  # one document; stays below the pool's per-call timeout


def _cap_memory(memory_mb: int) -> None:
    # Before any reader imports pandas: pyarrow's own allocator reserves about 1 GB of address space, which put
    # a warm worker that had read a spreadsheet at the edge of its RLIMIT_AS cap (a later document then failed).
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if memory_mb > 0:
        size = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size, size))


class _Worker:
    """One capped worker process, started on first use and replaced after a call overran or crashed it.
    The fallback where bubblewrap cannot run: the process sees what the server sees."""

    def __init__(self, limits: ReaderLimits) -> None:
        self.limits = limits
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # forkserver: a clean process, not a fork of a threaded server.
            context = multiprocessing.get_context("forkserver")
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=context, initializer=_cap_memory, initargs=(self.limits.memory_mb,)
            )
        return self._pool

    def discard(self) -> None:
        """Kill the worker (a call overran its budget, or the worker died) so the next call gets a fresh one."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        future = self._executor().submit(function, *args, **kwargs)
        try:
            return future.result(timeout=self.limits.timeout_s)
        except FutureTimeout:
            self.discard()
            raise DocumentError(TIMEOUT_TEXT.format(timeout=self.limits.timeout_s)) from None
        except MemoryError:
            raise DocumentError(MEMORY_TEXT.format(memory=self.limits.memory_mb)) from None
        except BrokenProcessPool:
            self.discard()
            raise DocumentError(CRASHED_TEXT) from None


class _Timeout(Exception):
    pass


class _Closed(Exception):
    pass


class _Invalid(Exception):
    pass


_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``args`` from a thread that lives as long as the server.

    ``--die-with-parent`` is ``PR_SET_PDEATHSIG``, whose "parent" is the *thread* that started bwrap: started
    from a caller's thread (anyio's workers end after a few idle seconds), a warm worker would be killed with
    that thread and the next call would find it dead.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowllm-reader-spawner")
        spawner = _spawner

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the server's log: bwrap's own errors, a parser's warnings
            env=env,
            cwd="/",
            bufsize=0,
            start_new_session=True,  # not in the server's process group: a terminal's ^C is the server's to handle
        )

    return spawner.submit(start).result()


class _Child:
    """One running isolated worker: the bwrap process and the two ends of the protocol's pipes."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.requests = process.stdin.fileno()
        self.replies = process.stdout.fileno()
        self.ready = False
        for fd in (self.requests, self.replies):
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, 1031, _CHUNK)  # F_SETPIPE_SZ: fewer wake-ups for a large document

    def kill(self) -> None:
        """Kill bwrap: ``--die-with-parent`` takes its PID namespace's first process, and with it (the kernel
        does that) every process the parser may have started."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def close_pipes(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _wait_for(fd: int, event: int, deadline: float | None) -> None:
    poller = select.poll()
    poller.register(fd, event)
    while True:
        timeout_ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)
        if poller.poll(timeout_ms):
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise _Timeout


def _write_all(fd: int, data: bytes, deadline: float | None) -> None:
    view = memoryview(data)
    while view:
        _wait_for(fd, select.POLLOUT, deadline)
        try:
            written = os.write(fd, view[:_CHUNK])
        except BlockingIOError:
            continue
        except OSError:  # EPIPE: the worker is gone
            raise _Closed from None
        view = view[written:]


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        _wait_for(fd, select.POLLIN, deadline)
        try:
            chunk = os.read(fd, min(size - len(buf), _CHUNK))
        except BlockingIOError:
            continue
        except OSError:
            raise _Closed from None
        if not chunk:
            raise _Closed
        buf += chunk
    return bytes(buf)


def _read_frame(fd: int, deadline: float | None) -> Any:
    """One reply, parsed as JSON and nothing else: its bytes are the worker's, which a parser may control."""
    size = int.from_bytes(_read_exact(fd, 8, deadline), "big")
    if size > _MAX_REPLY_BYTES:
        raise _Invalid
    data = _read_exact(fd, size, deadline)
    try:
        return json.loads(data.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise _Invalid from None


def _others_can_enter(path: str, bound: str) -> bool:
    """Whether a uid with no rights of its own can list ``path`` inside the sandbox, where it lies within the
    bound folder ``bound``: bwrap makes the folders above a bound one 0755, so only the modes from ``bound``
    down to ``path`` count (a Python install under ``/root`` is fine; one whose own folders are 0700 is not)."""
    current, need = os.path.realpath(path), 0o005
    while True:
        try:
            if os.stat(current).st_mode & need != need:
                return False
        except OSError:
            return False
        parent = os.path.dirname(current)
        if current == bound or parent == current:
            return True
        current, need = parent, 0o001


def _unprivileged_can_import(package_dir: str) -> bool:
    """Whether the sandbox uid could import the standard library, the installed packages and flowllm."""
    import sysconfig

    bound = [p for p in python_paths() if p != "/"]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if not path or not os.path.isdir(path):
            continue
        real = os.path.realpath(path)
        roots = [b for b in bound if real == b or real.startswith(b.rstrip("/") + "/")]
        if not roots or not _others_can_enter(real, max(roots, key=len)):
            return False
    if not _others_can_enter(package_dir, package_dir) or not _others_can_enter(
        os.path.join(package_dir, "tools"), package_dir
    ):
        return False
    try:
        wanted = ("__init__.py", "tools/__init__.py", "tools/web/documents.py")
        return all(os.stat(os.path.join(package_dir, name)).st_mode & 0o004 for name in wanted)
    except OSError:
        return False


class _IsolatedWorker:
    """One warm worker under bubblewrap, started on first use and replaced after a call overran or crashed it
    (the replacement starts at once, so that the next call finds it warm)."""

    def __init__(self, limits: ReaderLimits, probe: BwrapProbe) -> None:
        self.limits = limits
        self.probe = probe
        self._child: _Child | None = None
        self._lock = threading.Lock()  # held by the call using the worker (close() may come from elsewhere)

    def _command(self) -> tuple[list[str], dict[str, str]]:
        package_dir = os.path.dirname(os.path.realpath(flowllm.__file__))
        as_root = os.getuid() == 0
        uid: int | None = None
        options: tuple[str, ...] = ()
        if as_root:
            # Root's bwrap makes no user namespace and would hand the worker every capability. It keeps only
            # the two it needs to drop to the sandbox uid; where that uid could not import the Python install
            # (a folder of it that others may not enter), it stays uid 0 inside the namespaces with no
            # capability at all: it still sees nothing but the bound folders, all read-only, but root owns those
            # (they are read-only mounts, so that is only their owner bits) and RLIMIT_NPROC does not hold it.
            if _unprivileged_can_import(package_dir):
                uid = sandbox_uid()
                options = ("--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID")
            else:
                options = ("--cap-drop", "ALL")
        mounts = bwrap_mounts(
            _TMP_BYTES, chdir=SANDBOX_HOME, read_only=((package_dir, f"{PACKAGE_ROOT_INSIDE}/flowllm"),)
        )
        env = {**child_env(SANDBOX_HOME), "PYTHONPATH": PACKAGE_ROOT_INSIDE}
        config = {
            "uid": uid,
            "memory_mb": self.limits.memory_mb,
            "fsize": _TMP_BYTES,
            "nproc": _MAX_PROCESSES,
            "env": sorted(env),
        }
        command = bwrap_command(self.probe, mounts, as_root=as_root, allow_network=False, options=options)
        # -P: nothing of the working directory on sys.path; -s: no user site (HOME is the sandbox's anyway).
        worker = [sys.executable, "-P", "-s", "-X", "utf8", "-c", program("reader_worker"), json.dumps(config)]
        return [*command, *worker], env

    def _start(self) -> _Child:
        args, env = self._command()
        return _Child(_spawn(args, env))

    def _ready_child(self) -> _Child:
        """The running worker, started if need be, once it has imported the readers (not the call's budget)."""
        child = self._child
        if child is None:
            try:
                child = self._child = self._start()
            except OSError as exc:
                raise DocumentError(NOT_STARTED_TEXT.format(detail=f"{type(exc).__name__}: {exc}")) from None
        if not child.ready:
            try:
                hello = _read_frame(child.replies, time.monotonic() + _START_TIMEOUT_S)
            except (_Timeout, _Closed, _Invalid) as exc:
                self._drop(child, replace=False)
                detail = "it did not start in time" if isinstance(exc, _Timeout) else "it exited at start"
                raise DocumentError(NOT_STARTED_TEXT.format(detail=detail)) from None
            if not isinstance(hello, dict) or hello.get("ready") is not True:
                self._drop(child, replace=False)
                raise DocumentError(NOT_STARTED_TEXT.format(detail="it did not say it was ready"))
            child.ready = True
        return child

    def _drop(self, child: _Child, *, replace: bool) -> None:
        child.kill()
        child.close_pipes()
        if self._child is child:  # else close() dropped it already: start nothing more
            self._child = None
            if replace:
                with contextlib.suppress(OSError):
                    self._child = self._start()

    def discard(self) -> None:
        """Kill the worker; its pipes are closed here unless a call is using them (it closes them itself)."""
        child, self._child = self._child, None
        if child is None:
            return
        child.kill()
        if self._lock.acquire(blocking=False):
            try:
                child.close_pipes()
            finally:
                self._lock.release()

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        request = pickle.dumps((function, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            child = self._ready_child()
            timeout = self.limits.timeout_s
            deadline = time.monotonic() + timeout if timeout > 0 else None
            try:
                _write_all(child.requests, len(request).to_bytes(8, "big") + request, deadline)
                del request
                reply = _read_frame(child.replies, deadline)
            except _Timeout:
                self._drop(child, replace=True)
                raise DocumentError(TIMEOUT_TEXT.format(timeout=timeout)) from None
            except _Closed:
                self._drop(child, replace=True)
                raise DocumentError(CRASHED_TEXT) from None
            except _Invalid:
                self._drop(child, replace=True)
                raise DocumentError(INVALID_TEXT) from None
            if isinstance(reply, dict) and "ok" in reply and len(reply) == 1:
                return cast(T, reply["ok"])
            error = _reply_error(reply, self.limits)
            if error is None:  # not a reply this program sends: whatever follows it cannot be trusted either
                self._drop(child, replace=True)
                error = DocumentError(INVALID_TEXT)
            raise error


def _reply_error(reply: Any, limits: ReaderLimits) -> DocumentError | None:
    """The error a worker's reply reports, or None when the reply is not one it could have sent."""
    if not isinstance(reply, dict):
        return None
    kind, message = reply.get("error"), reply.get("message")
    if kind == "memory":
        return DocumentError(MEMORY_TEXT.format(memory=limits.memory_mb))
    if not isinstance(message, str):
        return None
    message = message[:_MAX_MESSAGE_CHARS]
    if kind == "document":
        return DocumentError(message)
    if kind == "failed":
        return DocumentError(FAILED_TEXT.format(detail=message))
    return None


def isolation_problem() -> str | None:
    """Why readers cannot be sandboxed here (None: they are, with bubblewrap)."""
    if not sys.platform.startswith("linux"):
        return "the reader sandbox needs Linux"
    probe = probe_bwrap()
    return None if probe.path is not None else probe.problem


_warned = False


class ReaderProcess:
    """Up to ``workers`` capped worker processes that run reader functions under ``limits``; thread-safe.

    A server shared by a run's tasks reads their documents concurrently, one per worker; a further call waits
    for a free worker. Workers start on first use, so a server that reads no document starts none.

    ``isolate``: run each worker under bubblewrap where it works here (``isolated`` says whether it does). An
    isolated worker's result comes back as JSON, so a reader function returns ``str`` (or another JSON value:
    a tuple comes back as a list); any exception of it but ``DocumentError`` and ``MemoryError`` comes back as a
    ``DocumentError`` saying the reader failed. ``function`` is sent by reference (pickle): a module-level
    function of flowllm or of an installed package, or a builtin.
    """

    def __init__(self, limits: ReaderLimits | None = None, workers: int = 1, *, isolate: bool = True) -> None:
        self.limits = limits or ReaderLimits()
        self.problem = isolation_problem() if isolate else "isolation was switched off"
        self.isolated = self.problem is None
        self._workers: list[_Worker | _IsolatedWorker] = []
        for _ in range(max(1, workers)):
            self._workers.append(_IsolatedWorker(self.limits, probe_bwrap()) if self.isolated else _Worker(self.limits))
        self._free: queue.SimpleQueue[_Worker | _IsolatedWorker] = queue.SimpleQueue()
        for worker in self._workers:
            self._free.put(worker)

    def warn_if_not_isolated(self, server: str) -> None:
        """Say once per process, on stderr, that documents are parsed without the sandbox (and why)."""
        global _warned
        if self.isolated or _warned:
            return
        _warned = True
        print(
            f"{server}: document readers run without a sandbox ({self.problem}): a parser exploited by a crafted "
            "file would see what this server sees (files, network, processes)",
            file=sys.stderr,
            flush=True,
        )

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        worker = self._free.get()
        try:
            return worker.run(function, *args, **kwargs)
        finally:
            self._free.put(worker)

    def close(self) -> None:
        for worker in self._workers:
            worker.discard()
