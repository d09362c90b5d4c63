"""``python -m flowllm`` for the tests, forked from a process that has imported the app already.

A run of the app spends about three CPU-seconds importing the SDKs, Hydra, the MCP client and the report before
it does anything, and the suite starts the app a few hundred times. A *zygote* (one per test process, started at
its first use) imports those modules once, then forks one child per run. The child is a process of its own, as a
subprocess is: its own arguments, environment, working folder, standard streams (``stdin`` is ``/dev/null``),
process id and signals, and it exits the way ``python -m flowllm`` exits. Only the modules it starts with are
already imported (and its hash seed is the zygote's). The tests of what a fresh interpreter does (the wheel, end
to end, plug-ins found by entry point, Ctrl-C under a closed pipe, Ray's nodes) still start ``python -m flowllm``
themselves.

The app's own Python children are forked too: in a forked app, ``sys.executable`` is a launcher
(tests/applaunch.py) that has the zygote fork ``python -m flowllm.tools...`` (a tool server) or ``python -m
flowllm`` (a worker) with the launcher's streams, folder and environment, passes signals on, exits as the child
exited, and takes the child with it when it dies. A forked process exits as an interpreter does (threads joined,
``atexit`` handlers run, streams flushed, the same status) but without freeing every module it holds, which
costs about a CPU-second in a process that has imported the SDKs, Hydra and MCP.

Protocol, over a Unix socket: the test process sends one JSON request with its two output files' descriptors
(``SCM_RIGHTS``; a launcher sends its stdin too); the zygote forks a waiter, which forks the app, sends its pid,
waits for it (for a launcher's request: and kills it if the launcher, found by ``SO_PEERCRED``, ends first) and
sends its exit status (negative: the signal that ended it, as ``subprocess`` says). Forks are made only by the
zygote's single thread, never from the test process (which has threads of its own).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.util
import json
import os
import random
import runpy
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# What ``python -m flowllm`` imports on the way to a run and its summary (module-level imports only, none of
# which starts a thread: the zygote checks it has one thread before it forks).
PRELOAD = (
    "flowllm.cli.run",
    "flowllm.app",
    "flowllm.cli.command",
    "flowllm.run.report",
    "flowllm.tools.client.connection",
    "flowllm.bundle.cli",
    "flowllm.verify.cli",
    "flowllm.inspect.cli",
    "anthropic",
    "openai",
    "hydra.utils",
    # the built-in tool servers a run starts (as ``python -m``, through tests/applaunch.py)
    "flowllm.tools.python",
    "flowllm.tools.files",
    "flowllm.tools.math",
    "flowllm.tools.browse",
    "flowllm.tools.search",
    "flowllm.tools.audio",
    # imported on the way by every run: the turn's nodes and wire formats, the SDKs' HTTP stack, the emulator's
    # server, orjson's numpy support (the recorder asks for it), Hydra's plugins and logging set-up
    "flowllm.nodes.dispatch",
    "flowllm.nodes.executed",
    "flowllm.nodes.history",
    "flowllm.nodes.model",
    "flowllm.nodes.tokens",
    "flowllm.nodes.toolcalls",
    "flowllm.providers.wire.chat_history",
    "flowllm.providers.wire.openai_chat",
    "flowllm.providers.wire.openai_responses",
    "flowllm.providers.wire.streaming",
    "httpx2",
    "httpcore2",
    "trio",
    "truststore",
    "anyio._backends._asyncio",
    "openai.resources.responses",
    "openai.lib.streaming.responses",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "numpy",
    "rich._emoji_codes",
    "omegaconf._impl",
    "hydra._internal.logging_config",
    "hydra._internal.core_plugins.basic_launcher",
    "hydra._internal.core_plugins.basic_sweeper",
    "hydra._internal.core_plugins.file_config_source",
    "hydra._internal.core_plugins.importlib_resources_config_source",
    "hydra._internal.core_plugins.structured_config_source",
)
# Imported when installed (the dev extra's launchers): a run imports them while Hydra looks for plug-ins.
OPTIONAL_PRELOAD = (
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher",
)
LAUNCHER = Path(__file__).resolve().parent / "applaunch.py"
# The launcher's module process dies with it: the zygote watches both through pidfds (Linux 5.3 and later).
FORKS_CHILDREN = hasattr(os, "pidfd_open")
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Request:
    module: str  # python -m MODULE
    args: list[str]
    cwd: str
    env: dict[str, str]
    new_session: bool = False  # subprocess's start_new_session
    # From tests/applaunch.py: its stdin comes too, and the module's process ends if the launcher ends first.
    launcher: bool = False


def _child(request: Request, fds: list[int]) -> None:
    """In the forked app process: become ``python -m MODULE ARGS`` started in ``cwd`` with ``env``."""
    streams = fds if request.launcher else [os.open(os.devnull, os.O_RDONLY), *fds]
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
    for fd in streams:
        if fd > 2:
            os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if request.new_session:
        os.setsid()
    os.chdir(request.cwd)
    zygote_path = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(request.env)
    extra = [
        p for p in request.env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in zygote_path.split(os.pathsep)
    ]
    sys.path[1:1] = extra  # as the interpreter puts PYTHONPATH: after the script's folder
    random.seed()  # a fresh interpreter's random state, not the zygote's
    sys.argv = [request.module, *request.args]  # runpy puts the module's file in sys.argv[0]


def _serve_one(listener: socket.socket, conn: socket.socket) -> Request | None:
    """Read one request, fork the waiter; in the app process return its request, in the zygote None."""
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    data = json.loads(message)
    request = Request(**data)
    if len(fds) != (3 if request.launcher else 2):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a request with {len(fds)} file descriptors")
    if os.fork():  # the zygote
        conn.close()
        for fd in fds:
            os.close(fd)
        return None
    try:  # the waiter: never back into the zygote's loop, whatever happens
        listener.close()
        launcher = _peer_pid(conn) if request.launcher else None
        app = os.fork()
        if app == 0:
            conn.close()
            _child(request, fds)
            return request
        for fd in fds:
            os.close(fd)
        _tell(conn, app)
        if launcher is not None:
            _end_with(app, launcher)
        _, status = os.waitpid(app, 0)
        _tell(conn, os.waitstatus_to_exitcode(status))
    except BaseException:  # the waiter, or the app process before it runs: print, and exit here
        traceback.print_exc()
        os._exit(70)
    os._exit(0)


def _tell(conn: socket.socket, number: int) -> None:
    """One reply line; whoever asked may have ended (a launcher SIGKILLed with its app): then nobody is told."""
    with contextlib.suppress(BrokenPipeError):
        conn.sendall(f"{number}\n".encode())


def _peer_pid(conn: socket.socket) -> int:
    """The process at the other end of a Unix socket (``SO_PEERCRED``: pid, uid, gid)."""
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return int(pid)


def _end_with(app: int, launcher: int) -> None:
    """Wait until ``app`` exits, SIGKILLing it if ``launcher`` (a process that stands in for it) exits first."""
    app_fd = os.pidfd_open(app)
    try:
        launcher_fd = os.pidfd_open(launcher)
    except ProcessLookupError:
        os.close(app_fd)
        os.kill(app, signal.SIGKILL)
        return
    try:
        ready, _, _ = select.select([app_fd, launcher_fd], [], [])
        if app_fd not in ready:
            os.kill(app, signal.SIGKILL)
    finally:
        os.close(app_fd)
        os.close(launcher_fd)


def _write_launcher(folder: str) -> None:
    """``python`` in ``folder``: tests/applaunch.py under a ``#!`` line naming this interpreter."""
    path = os.path.join(folder, "python")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"#!{sys.executable} -SI\n{LAUNCHER.read_text(encoding='utf-8')}")
    os.chmod(path, 0o755)


def serve(path: str) -> Request | None:
    """The zygote's loop: import, say ready, then fork a run per connection. Returns only in an app process."""
    for name in PRELOAD:
        __import__(name)
    for name in OPTIONAL_PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    if threading.active_count() != 1:
        raise SystemExit(f"appfork: importing the app started threads {threading.enumerate()}: cannot fork safely")
    # What the zygote holds is never freed by a child: out of the collector's sight, a child's collections do not
    # walk (and so copy, page by page) the imported modules' objects. A run takes about a quarter less time.
    gc.collect()
    gc.freeze()
    _write_launcher(os.path.dirname(path))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            raise SystemExit(0)  # the test process has gone (its end of our stdin closed): so do we
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        try:
            request = _serve_one(listener, conn)
        except Exception as exc:  # a broken request: say so to that test, keep serving the others
            print(f"appfork: {exc!r}", file=sys.stderr, flush=True)
            conn.close()
            continue
        if request is not None:
            listener.close()
            return request
        while True:  # reap the waiters that have finished
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


@dataclass
class Zygote:
    """The test process's handle on its zygote."""

    proc: subprocess.Popen[str]
    path: str

    @classmethod
    def launch(cls) -> Zygote:
        folder = tempfile.mkdtemp(prefix="flowllm-appfork-")
        path = os.path.join(folder, "socket")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.appfork", path],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,  # never written: it closes when this process ends, however it ends
            text=True,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the imports take a few seconds; a failure ends the process (empty line)
        if line.strip() != "ready":
            proc.kill()
            raise RuntimeError(f"the app's zygote did not start (exit {proc.wait()})")
        zygote = cls(proc, path)
        atexit.register(zygote.stop)
        return zygote

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)

    def start(self, request: Request, stdout: int, stderr: int) -> AppProcess:
        """The app started: ``stdout`` and ``stderr`` are file descriptors it writes to."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            message = json.dumps(vars(request)).encode()
            socket.send_fds(conn, [message], [stdout, stderr])
            conn.shutdown(socket.SHUT_WR)
            replies = _Lines(conn)
            first = replies.next(START_TIMEOUT_S)
            if first is None:
                raise RuntimeError(f"the app's zygote did not start python -m {request.module} {request.args}")
        except BaseException:
            conn.close()
            raise
        return AppProcess([sys.executable, "-m", request.module, *request.args], int(first), replies)


@dataclass
class AppProcess:
    """A started app, as much of ``subprocess.Popen`` as the tests use: ``pid``, ``poll``, ``wait``,
    ``send_signal``, ``kill`` and ``returncode``."""

    args: list[str]
    pid: int
    _replies: _Lines
    returncode: int | None = None

    def poll(self) -> int | None:
        return self._status(0.0)

    def wait(self, timeout: float | None = None) -> int:
        status = self._status(timeout)
        if status is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return status

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            line = self._replies.next(timeout)
            if line is not None:
                self.returncode = int(line)
                self._replies.conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            # As subprocess does: the app may have ended (and been reaped by its waiter) since that look.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Lines:
    """The zygote's replies on one connection, a line at a time, each awaited at most so long."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def next(self, timeout: float | None) -> str | None:
        """The next line, or None when ``timeout`` seconds passed first (None: wait as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            # Past the deadline, one look that does not wait: poll() (timeout 0) must still see an exit status.
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.conn], [], [], left)[0]:
                return None
            chunk = self.conn.recv(4096)
            if not chunk:
                raise RuntimeError("the app's zygote closed the connection without an exit status")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


def _text(handle: Any) -> str:
    handle.seek(0)
    return handle.read().decode("utf-8", errors="replace")


_started: list[Zygote] = []  # this test process's zygote, started at the first run
_starting = threading.Lock()


def run_app(
    args: list[str], *, cwd: Path, env: dict[str, str], timeout: float, module: str = "flowllm"
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS``, its output captured: forked from the zygote, or a plain subprocess where fork is
    not available or ``FLOWLLM_TEST_FORK=0`` asks for one."""
    command = [sys.executable, "-m", module, *args]
    if os.environ.get("FLOWLLM_TEST_FORK") == "0" or not hasattr(os, "fork"):
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = _zygote().start(Request(module, args, str(cwd), env), out.fileno(), err.fileno())
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:  # the time is up: end it as subprocess.run does, with what it printed
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(command, timeout, _text(out), _text(err)) from None
        return subprocess.CompletedProcess(command, proc.wait(), _text(out), _text(err))


def start_app(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdout: int,
    stderr: int,
    module: str = "flowllm",
    new_session: bool = False,
) -> AppProcess | subprocess.Popen[Any]:
    """``python -m MODULE ARGS`` started, its output to the file descriptors given (see ``run_app``)."""
    if os.environ.get("FLOWLLM_TEST_FORK") == "0" or not hasattr(os, "fork"):
        command = [sys.executable, "-m", module, *args]
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=new_session)
    return _zygote().start(Request(module, args, str(cwd), env, new_session), stdout, stderr)


def launcher() -> str | None:
    """The zygote's launcher (tests/applaunch.py): ``python -m flowllm`` started with it is forked; None where
    forking is off (``FLOWLLM_TEST_FORK=0``, or no ``fork``)."""
    if os.environ.get("FLOWLLM_TEST_FORK") == "0" or not hasattr(os, "fork") or not FORKS_CHILDREN:
        return None
    return os.path.join(os.path.dirname(_zygote().path), "python")


def _zygote() -> Zygote:
    with _starting:
        if not _started or _started[0].proc.poll() is not None:
            _started[:] = [Zygote.launch()]
        return _started[0]


def _exit_code(exc: SystemExit) -> int:
    """The exit status ``SystemExit`` gives an interpreter (a message is printed, and the status is 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _run_as_main(module: str) -> None:
    """``python -m MODULE`` in this process, and its exit, without the interpreter's teardown.

    An interpreter that ends waits for its non-daemon threads, runs the ``atexit`` handlers, flushes its standard
    streams and exits with the status ``SystemExit`` gave (1 and a traceback for another exception; an uncaught
    Ctrl-C kills it with SIGINT). That is done here, and then ``os._exit``: the rest of a teardown, freeing every
    module the zygote imported (the SDKs, Hydra, MCP...), costs about a CPU-second and is seen by nobody.
    """
    interrupted = False
    try:
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise SystemExit(f"{sys.executable}: No module named {module}")
        main = f"{module}.__main__" if spec.submodule_search_locations is not None else module
        sys.modules.pop(main, None)  # run afresh as __main__, as python -m does (runpy warns when it was imported)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # The interpreter's own first steps of an exit: its thread-exit hooks (executors' workers told to stop) and a
    # join of every non-daemon thread, then the atexit handlers.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _main() -> None:
    socket_path = sys.argv[1]
    request = serve(socket_path)
    if request is None:
        return
    if request.module == "flowllm" and FORKS_CHILDREN:  # the app's Python children (tool servers, workers) too
        sys.executable = os.path.join(os.path.dirname(socket_path), "python")
    _run_as_main(request.module)


if __name__ == "__main__":
    _main()
