"""The isolation toolkit shared by run_python (``flowllm.tools.sandbox.execute``) and the document reader's worker
(``flowllm.tools.web.readerproc``): the child's fixed environment, the sandbox uid, the folders a sandbox shows
read-only, bubblewrap's command line and whether it works here, and the words for what a sandbox lacks.

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
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from flowllm.core.scratch import new_scratch
from flowllm.tools.sandbox.hardening import remove_tree

PROBE_TMP_BYTES = 16 * 1024 * 1024  # the probe's private /tmp: the smallest a run_python call gets

UID_BASE = 1_000_000  # sandbox uids are UID_BASE + the tool server's pid: far above any real account


SANDBOX_HOME = "/tmp/.home"


_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


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


def traversable_by_others(path: str) -> bool:
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


def workspace_mounts(workspace: str, home: str | None, tmp_bytes: int) -> list[str]:
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
    folder = str(new_scratch("flowllm-bwrap-probe-"))
    problem = ""
    try:
        # --disable-userns (bwrap >= 0.8) hardens a sandbox that holds without it: an older bwrap is used without.
        for disable_userns in (False,) if as_root else (True, False):
            probe = BwrapProbe(path, disable_userns=disable_userns)
            mounts = workspace_mounts(folder, None, PROBE_TMP_BYTES)
            command = [*bwrap_command(probe, mounts, as_root=as_root, allow_network=False), true]
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
        remove_tree(folder)
    return BwrapProbe(None, f"{path} cannot build the sandbox here: {problem}")


def describe_gaps(gaps: list[str]) -> str:
    """One line for a user: what this machine's sandbox lacks and what that means."""
    parts = [GAP_TEXT.get(gap, gap) for gap in gaps]
    if any(gap in BWRAP_CLOSES for gap in gaps):
        parts.append(BWRAP_HINT)
    if "bwrap" in gaps:  # the probe ran in this process to report the gap, so its answer is cached
        parts.append(f"bubblewrap: {probe_bwrap().problem}")
    return "; ".join(parts)
