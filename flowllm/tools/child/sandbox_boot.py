"""run_python's bootstrap: isolates the child, sets its limits, then runs the model's code as ``__main__``.

Run as ``python -P -X utf8 -c <program("sandbox_boot")> <config JSON>`` (see ``flowllm.tools.sandbox.execute``); the
code comes on stdin. Standard library only: the child must not need flowllm. What isolation it achieved goes,
as JSON, to the pipe whose fd is ``cfg["report"]``.
"""

import ctypes
import json
import os
import resource
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # joined ahead of this text by flowllm.tools.child.program
    from flowllm.tools.child.limits import set_limit

NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SCRIPT_NAME = "<run_python>"
REFUSED_EXIT = 126  # isolation is required and missing

Config = dict[str, Any]
Report = dict[str, Any]


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(value: str | None) -> bytes | None:
        return value.encode() if value is not None else None

    _check(_libc().mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _pdeathsig() -> None:
    _libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))  # die with the process that started us


def _join_cgroup(cfg: Config, report: Report) -> None:
    for procs in cfg["cgroup_procs"]:
        try:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
        except OSError:
            report["gaps"].append("cgroup")
            return


def _guard_sockets() -> None:
    import socket

    def _refuse(*args: object, **kwargs: object) -> Any:
        raise PermissionError("network access is disabled in run_python")

    for name in ("connect", "connect_ex", "sendto", "sendmsg", "bind"):
        setattr(socket.socket, name, _refuse)
    socket.getaddrinfo = _refuse
    socket.create_connection = _refuse


def _unprivileged_network() -> bool:
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


def _build_root(cfg: Config) -> None:
    # As root: a private mount namespace whose root is a fresh tmpfs holding only the system folders and the
    # Python install (read-only), the workspace (read-write), a private /tmp and a minimal /dev.
    flags = NEWNS | NEWPID | NEWIPC | NEWUTS | (0 if cfg["allow_network"] else NEWNET)
    _check(_libc().unshare(flags), "unshare")
    _mount(None, "/", None, REC | PRIVATE)
    sources: dict[str, tuple[int, bool]] = {}
    for path in cfg["ro_paths"]:
        if os.path.exists(path):
            sources[path] = (os.open(path, os.O_PATH), True)
    sources[cfg["workspace"]] = (os.open(cfg["workspace"], os.O_PATH | os.O_DIRECTORY), False)
    devices = [d for d in ("null", "zero", "full", "random", "urandom") if os.path.exists(f"/dev/{d}")]
    for dev in devices:
        sources[f"/dev/{dev}"] = (os.open(f"/dev/{dev}", os.O_PATH), False)
    root = cfg["new_root"]
    _mount("tmpfs", root, "tmpfs", NOSUID | NODEV, "size=1m,mode=0755")
    for sub in ("proc", "dev", "tmp"):
        os.makedirs(root + "/" + sub, exist_ok=True)
    _mount("tmpfs", root + "/tmp", "tmpfs", NOSUID | NODEV, f"size={cfg['tmp_mb']}m,mode=1777")
    os.makedirs(root + "/dev/shm", exist_ok=True)
    _mount("tmpfs", root + "/dev/shm", "tmpfs", NOSUID | NODEV, f"size={cfg['tmp_mb']}m,mode=1777")
    links = (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    )
    for name, target in links:
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
    os.makedirs(root + cfg["home"], exist_ok=True)
    os.chmod(root + cfg["home"], 0o777)


def _drop_privileges(cfg: Config) -> None:
    uid = cfg["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binary gives root back


def _wait_and_mirror(cfg: Config, pid: int) -> None:
    # The outer process waits for the namespace's first process and leaves the way it did.
    if cfg["report"]:
        os.close(cfg["report"])
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


def _inside_bwrap(cfg: Config, report: Report) -> None:
    # bubblewrap built the namespaces and the new root already. Our parent is its process 1 inside the PID
    # namespace, not the server, so the check on the parent's pid does not apply: --die-with-parent ties bwrap
    # to the server, and when bwrap's process 1 dies the kernel kills everything in the namespace.
    if "cgroup" in sys.argv[2:]:  # the wrapper that started bwrap could not join the call's cgroup
        report["gaps"].append("cgroup")
    for name in set(os.environ) - set(cfg["env"]):  # PWD, which bwrap sets for --chdir (and a shell's own)
        del os.environ[name]
    if os.getuid() == 0:
        # Root's bwrap makes no user namespace (one would map the code's uid to root outside), so we are still
        # root here: drop to the server's own uid, as the namespace path does.
        _drop_privileges(cfg)
        _pdeathsig()  # a change of credentials clears it
    else:
        _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # bwrap sets it too; this does not rely on that


def _isolate(cfg: Config, report: Report) -> None:
    if not sys.platform.startswith("linux"):
        report["gaps"] += ["namespaces", "privileges"]
        return
    _pdeathsig()
    if cfg["bwrap"]:
        _inside_bwrap(cfg, report)
        return
    if os.getppid() != cfg["parent"]:  # the server died before prctl took effect
        os._exit(137)
    _join_cgroup(cfg, report)
    if os.getuid() != 0:
        report["gaps"] += ["privileges", "filesystem", "pid namespace"]
        if not cfg["allow_network"] and not _unprivileged_network():
            report["gaps"].append("network namespace")
            _guard_sockets()
        return
    try:
        _build_root(cfg)
    except OSError as exc:
        report["gaps"] += ["filesystem", "pid namespace"]
        report["error"] = str(exc)
        if not cfg["allow_network"] and _libc().unshare(NEWNET) != 0:
            report["gaps"].append("network namespace")
            _guard_sockets()
        if cfg["python_traversable"]:
            _drop_privileges(cfg)
            _pdeathsig()
        else:
            report["gaps"].append("privileges")
        return
    pid = os.fork()
    if pid:
        _wait_and_mirror(cfg, pid)
    # The first process of the new PID namespace: when it dies, the kernel kills everything the code started.
    _mount("proc", cfg["new_root"] + "/proc", "proc", NOSUID | NODEV | NOEXEC)
    _mount(None, cfg["new_root"], None, REMOUNT | RDONLY | NOSUID | NODEV)
    os.chroot(cfg["new_root"])
    _drop_privileges(cfg)
    _pdeathsig()  # a change of credentials clears it


def _setup(cfg: Config) -> None:
    report: Report = {"gaps": list(cfg["gaps"])}  # what the server already knows is missing (no cgroup, no bwrap)
    _isolate(cfg, report)
    os.chdir(cfg["workspace"])
    if cfg["memory_mb"] > 0:
        set_limit(resource.RLIMIT_AS, cfg["memory_mb"] * 1024 * 1024)
    if cfg["cpu_s"] > 0:
        set_limit(resource.RLIMIT_CPU, cfg["cpu_s"])
    if cfg["fsize_mb"] > 0:
        set_limit(resource.RLIMIT_FSIZE, cfg["fsize_mb"] * 1024 * 1024)
    if cfg["max_processes"] > 0 and os.getuid() != 0:  # root is exempt from the cap, so it means nothing there
        set_limit(resource.RLIMIT_NPROC, cfg["max_processes"])
    set_limit(resource.RLIMIT_CORE, 0)
    if cfg["report"]:
        report["uid"] = os.getuid()
        try:
            os.write(cfg["report"], json.dumps(report).encode())
        finally:
            os.close(cfg["report"])
    if cfg["required"] and report["gaps"]:
        missing = ", ".join(report["gaps"])
        sys.stderr.write(f"run_python refuses to run without full isolation; missing: {missing}\n")
        os._exit(REFUSED_EXIT)


def main(cfg: Config) -> None:
    _setup(cfg)
    code = sys.stdin.read()
    sys.stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 (the code's stdin, open while it runs)
    import linecache
    import traceback
    import types

    linecache.cache[SCRIPT_NAME] = (len(code), None, code.splitlines(True), SCRIPT_NAME)
    sys.argv = [SCRIPT_NAME]
    sys.path.insert(0, os.getcwd())
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    try:
        exec(compile(code, SCRIPT_NAME, "exec"), module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        # Skip this bootstrap's own frame: the model should see only its code in the traceback.
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb)
        sys.stderr.flush()
        sys.exit(1)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
