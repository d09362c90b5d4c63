"""run_python under bubblewrap: forced as root, and the real case it exists for, flowllm as an unprivileged user.

The hostile checks run in a driver process (``DRIVER``) that calls ``run_python_code`` with ``HOSTILE``'s code
and reports, as JSON, what the code saw from inside and what happened outside (signals received, connections
accepted, processes left, files planted). As nobody the driver runs on Debian's ``/usr/bin/python3`` with a
copy of the sandbox's modules in a world-readable folder: the project's own interpreter may live where nobody
cannot go. Without bubblewrap, ``setpriv`` or that interpreter, or when not root, the tests skip, saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowllm.tools.sandbox.execute import (
    Isolation,
    SandboxBackend,
    SandboxLimits,
    SandboxResult,
    probe_bwrap,
    run_python_code,
    sandbox_uid,
)
from tests.tools.helpers import alive, descendants

CANARY = "sk-canary-bwrap-0123456789abcdef"
PROJECT = Path(__file__).resolve().parents[2]
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
# What the sandbox needs of flowllm: these modules import nothing else of it (and nothing outside the stdlib).
SANDBOX_MODULES = (
    "__init__.py",
    "core/__init__.py",
    "core/scratch.py",
    "tools/__init__.py",
    "tools/sandbox/execute.py",
    "tools/sandbox/call.py",
    "tools/sandbox/isolation.py",
    "tools/sandbox/hardening.py",
    "tools/sandbox/cgroup.py",
    "tools/common.py",
    "tools/child/__init__.py",
    "tools/child/limits.py",
    "tools/child/sandbox_boot.py",
)
# Gaps bubblewrap exists to close; "cgroup" may remain where no cgroup can be made (an unprivileged user).
CLOSED_BY_BWRAP = {"privileges", "filesystem", "pid namespace", "network namespace", "bwrap"}

_is_root = hasattr(os, "geteuid") and os.geteuid() == 0
needs_root_and_bwrap = pytest.mark.skipif(
    not _is_root or shutil.which("bwrap") is None,
    reason="needs root (to force bubblewrap, or to become nobody) and bwrap (Debian package bubblewrap)",
)

_QUIET: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 60}

# Runs inside the sandbox. SETUP is replaced by the driver's JSON (paths, the marker, its pid and port).
HOSTILE = r"""
import json, os, signal, socket, sys
setup = json.loads(SETUP)
seen = {"uid": os.getuid(), "env": dict(os.environ)}

def attempt(action):
    try:
        return action()
    except OSError as exc:
        return "refused " + type(exc).__name__

def read(path):
    with open(path, "rb") as fh:
        return fh.read().decode(errors="replace")

def plant(path):
    with open(path, "w") as fh:
        fh.write("planted")
    return "wrote"

targets = [setup["secret"], setup["project_file"], setup["host_tmp"], f"/proc/{setup['parent']}/environ"]
targets += [f"/proc/{pid}/environ" for pid in os.listdir("/proc") if pid.isdigit()]
seen["reads"] = {path: attempt(lambda path=path: read(path)) for path in targets}
places = ["/planted", "/usr/planted", "/etc/planted", "/dev/planted", setup["project_dir"] + "/planted",
          setup["beside"] + "/planted"]
seen["writes"] = {path: attempt(lambda path=path: plant(path)) for path in places}
seen["workspace"] = attempt(lambda: plant("in-workspace.txt"))
seen["tmp"] = attempt(lambda: plant("/tmp/" + setup["marker"]))
seen["tmp_listing"] = sorted(os.listdir("/tmp"))
seen["pids"] = sorted(int(pid) for pid in os.listdir("/proc") if pid.isdigit())
seen["signal"] = attempt(lambda: os.kill(setup["parent"], signal.SIGUSR1) or "sent")
seen["connect"] = attempt(lambda: socket.create_connection(("127.0.0.1", setup["port"]), 10).close() or "connected")
seen["interfaces"] = sorted(name for _, name in socket.if_nameindex())

# A daemon that leaves the session and its parent; it says when it runs, so nothing here waits on a clock.
ready_read, ready_write = os.pipe()
os.set_inheritable(ready_write, True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        daemon = "import os, sys, time; os.write(int(sys.argv[1]), b'1'); time.sleep(600)"
        os.execv(sys.executable, [sys.executable, "-c", daemon, str(ready_write), setup["marker"]])
    os._exit(0)
os.close(ready_write)
os.wait()
seen["daemon_started"] = os.read(ready_read, 1) == b"1"
print(json.dumps(seen))
"""

# Runs outside the sandbox (as root, or as nobody), with only the stdlib and the copied sandbox modules.
DRIVER = r"""
import asyncio, json, os, signal, socket, sys, time
from pathlib import Path
from flowllm.tools.sandbox.execute import SandboxBackend, SandboxLimits, probe_bwrap, run_python_code, sandbox_uid

setup = json.loads(sys.argv[1])
hits = []
signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(8)
listener.setblocking(False)
host_tmp = Path(f"/tmp/flowllm-host-{setup['marker']}")
host_tmp.write_text(setup["canary"])
setup.update(port=listener.getsockname()[1], parent=os.getpid(), host_tmp=str(host_tmp))
# What this user may read itself: the sandbox, not file modes, must be what keeps the code from it.
control = {path: os.access(path, os.R_OK) for path in (setup["secret"], setup["project_file"], str(host_tmp))}
limits = SandboxLimits(timeout_s=30, backend=SandboxBackend(setup["backend"]))
workspace = Path(setup["workspace"])
code = setup["code"].replace("SETUP", repr(json.dumps(setup)))
try:
    result = asyncio.run(run_python_code(code, workspace, limits))
finally:
    host_tmp.unlink()


def daemons():
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():  # this driver's own argv holds the marker
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if setup["marker"].encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


deadline = time.monotonic() + 30  # the kill is immediate; this bound is only so a failure cannot hang
while daemons() and time.monotonic() < deadline:
    time.sleep(0.02)
try:
    listener.accept()
    accepted = 1
except BlockingIOError:
    accepted = 0
planted = workspace / "in-workspace.txt"
bomb = asyncio.run(run_python_code(setup["bomb"], workspace, SandboxLimits(max_processes=16, backend=limits.backend)))
print(json.dumps({
    "backend": result.backend.value if result.backend else None,
    "gaps": result.gaps,
    "exit_code": result.exit_code,
    "stdout": result.stdout,
    "stderr": result.stderr,
    "control": control,
    "signals": len(hits),
    "accepted": accepted,
    "daemons_left": daemons(),
    "host_tmp_planted": Path("/tmp", setup["marker"]).exists(),
    "in_workspace": planted.read_text() if planted.exists() else None,
    "sandbox_uid": sandbox_uid(),
    "parent": os.getpid(),
    "host_tmp": str(host_tmp),
    "probe": probe_bwrap().problem,
    "bomb": bomb.stdout,
}))
"""

FORK_BOMB = """
import os, time
made = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    made += 1
print(made)
"""


@pytest.fixture
def stage() -> Iterator[Path]:
    """A folder anyone may enter (pytest's ``tmp_path`` is 0700) holding the sandbox's modules, the driver and a
    run directory: a secret beside the task's workspace, as the run's config and other tasks would be."""
    root = Path(tempfile.mkdtemp(prefix="flowllm-bwrap-test-"))
    try:
        root.chmod(0o755)
        for module in SANDBOX_MODULES:
            target = root / "flowllm" / module
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(PROJECT / "flowllm" / module, target)
        (root / "driver.py").write_text(DRIVER)
        workspace = root / "run" / "tasks" / "t1" / "workspace"
        workspace.mkdir(parents=True)
        (root / "run" / "config.yaml").write_text(f"api_key: {CANARY}\n")
        for path in root.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _drive(stage: Path, command: list[str], backend: SandboxBackend) -> dict[str, Any]:
    setup = {
        "workspace": str(stage / "run" / "tasks" / "t1" / "workspace"),
        "secret": str(stage / "run" / "config.yaml"),
        "beside": str(stage / "run" / "tasks"),
        "project_file": str(PROJECT / "pyproject.toml"),
        "project_dir": str(PROJECT),
        "marker": f"flowllm-bwrap-{uuid.uuid4().hex}",
        "canary": CANARY,
        "backend": backend.value,
        "code": HOSTILE,
        "bomb": FORK_BOMB,
    }
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(stage), "OPENAI_API_KEY": CANARY}
    env["SOME_SERVICE_TOKEN"] = CANARY + "-token"
    done = subprocess.run(
        [*command, str(stage / "driver.py"), json.dumps(setup)],
        cwd=stage,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    report["setup"] = setup
    return report


def _assert_contained(report: dict[str, Any]) -> dict[str, Any]:
    """The hostile checks: what the code saw, and what it could do outside. Returns what it saw."""
    setup = report["setup"]
    assert report["backend"] == "bwrap", f"bwrap did not run: {report['probe']}"
    assert not CLOSED_BY_BWRAP & set(report["gaps"]), report["gaps"]
    assert report["exit_code"] == 0, report["stderr"]
    assert CANARY not in report["stdout"] + report["stderr"]
    seen: dict[str, Any] = json.loads(report["stdout"])
    # Not our environment, nor any process's: only the sandbox's allowlist.
    assert "PATH" in seen["env"] and "OPENAI_API_KEY" not in seen["env"] and "SOME_SERVICE_TOKEN" not in seen["env"]
    assert not any(CANARY in text for text in seen["reads"].values())
    # Not the run directory, the project or the host's /tmp, all readable to this user outside.
    assert all(report["control"].values()), report["control"]
    for path in (setup["secret"], setup["project_file"], report["host_tmp"]):
        assert seen["reads"][path].startswith("refused"), (path, seen["reads"][path])
    for path, value in seen["writes"].items():
        # The workspace's parents are folders bwrap made; under /tmp they are in the sandbox's private /tmp,
        # which the code may write (and, as nobody, owns): such a write lands there, as the next line checks.
        assert value.startswith("refused") or path.startswith("/tmp/"), json.dumps(seen["writes"])
    assert not (PROJECT / "planted").exists() and not Path(setup["beside"], "planted").exists()
    # The workspace is the one writable folder; /tmp is private (the host's is not there, ours stays inside).
    assert seen["workspace"] == "wrote" and report["in_workspace"] == "planted"
    assert seen["tmp"] == "wrote" and not report["host_tmp_planted"]
    assert not any(name.startswith("flowllm-host-") for name in seen["tmp_listing"])
    # No process outside is visible or reachable: the driver was not signalled.
    assert report["signals"] == 0 and seen["signal"].startswith("refused")
    assert report["parent"] not in seen["pids"]
    # No network: loopback only, and the driver's listener saw no one.
    assert seen["connect"].startswith("refused") and report["accepted"] == 0
    assert set(seen["interfaces"]) <= {"lo"}
    # The double-forked setsid daemon ran, and died with the call.
    assert seen["daemon_started"] and report["daemons_left"] == []
    # The process cap holds (plus the cgroup's few spare slots for the bootstrap), not 200.
    assert int(report["bomb"].split()[-1]) < 24
    return seen


@needs_root_and_bwrap
def test_forced_bwrap_as_root_contains_hostile_code(stage: Path) -> None:
    report = _drive(stage, [sys.executable], SandboxBackend.BWRAP)
    seen = _assert_contained(report)
    assert seen["uid"] == report["sandbox_uid"] != 0  # the server's own unprivileged uid, not root


@needs_root_and_bwrap
@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux) to become nobody")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason=f"needs {SYSTEM_PYTHON} (Debian's python3)")
def test_as_an_unprivileged_user_auto_uses_bwrap_and_contains_hostile_code(stage: Path) -> None:
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info >= (3, 11))"], **_QUIET)
    if version.stdout.strip() != "True":
        pytest.skip(f"{SYSTEM_PYTHON} is older than 3.11, which flowllm needs")
    workspace = stage / "run" / "tasks" / "t1" / "workspace"
    os.chown(workspace, NOBODY, NOBODY)
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON]
    report = _drive(stage, command, SandboxBackend.AUTO)
    seen = _assert_contained(report)
    assert seen["uid"] == NOBODY  # flowllm's own uid, inside a user namespace of its own


# In-process runs with bubblewrap forced: the behaviour of test_sandbox.py holds under it too.


def _forced(**limits: Any) -> SandboxLimits:
    return SandboxLimits(backend=SandboxBackend.BWRAP, **limits)


def _ran_under_bwrap(result: SandboxResult) -> None:
    assert result.backend is SandboxBackend.BWRAP, probe_bwrap().problem
    assert not CLOSED_BY_BWRAP & set(result.gaps or []), result.gaps


@needs_root_and_bwrap
async def test_forced_bwrap_runs_code_in_the_workspace_like_the_default(workspace: Path) -> None:
    (workspace / "data.txt").write_text("42\n")
    code = "import os\nprint(os.getcwd(), os.getuid())\nprint(open('data.txt').read().strip())\nopen('o.txt', 'w')"
    result = await run_python_code(code, workspace, _forced())
    _ran_under_bwrap(result)
    assert result.render() == f". {sandbox_uid()}\n42"
    assert (workspace / "o.txt").exists()
    failing = await run_python_code("x = 1\ny = x / 0\n", workspace, _forced())
    assert 'File "<run_python>", line 2, in <module>' in failing.stderr and "_main" not in failing.stderr
    assert failing.render().endswith("[exit status 1]")


@needs_root_and_bwrap
async def test_the_code_sees_the_same_environment_under_either_backend(workspace: Path) -> None:
    code = "import os\nprint(sorted(os.environ.items()))"
    under_bwrap = await run_python_code(code, workspace, _forced())
    _ran_under_bwrap(under_bwrap)
    own = await run_python_code(code, workspace, SandboxLimits(backend=SandboxBackend.NAMESPACES))
    assert under_bwrap.stdout == own.stdout and "HOME" in own.stdout


@needs_root_and_bwrap
async def test_a_signal_is_reported_as_one_under_bwrap(workspace: Path) -> None:
    result = await run_python_code("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", workspace, _forced())
    assert result.exit_code == -signal.SIGTERM
    assert result.render() == "[killed by signal SIGTERM]"


@needs_root_and_bwrap
async def test_a_timed_out_bwrap_run_leaves_no_process(workspace: Path) -> None:
    before = descendants()
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '60'])\ntime.sleep(60)"
    result = await run_python_code(code, workspace, _forced(timeout_s=1))
    assert result.timed_out
    assert alive(descendants() - before) == set()


@needs_root_and_bwrap
async def test_memory_is_limited_for_the_code_and_its_children_together_under_bwrap(workspace: Path) -> None:
    # Each child holds 100 MB and says so, then waits for its stdin to close: no clock involved. Their stdin is
    # closed once all three have answered, so a child that said "held" and then exited 0 held its 100 MB while
    # the others held theirs. The group's OOM killer may end a child after it said "held" (when a later one
    # allocates), so it is the children alive to the end that are counted, not the lines.
    code = textwrap.dedent(
        """
        import subprocess, sys
        child = "b = b'x' * (100 << 20); print('held', flush=True); import sys; sys.stdin.read()"
        procs = [subprocess.Popen([sys.executable, '-c', child], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True) for _ in range(3)]
        lines = [p.stdout.readline().strip() for p in procs]
        for p in procs:
            p.stdin.close()
        codes = [p.wait() for p in procs]
        print('held together:', sum(line == 'held' and code == 0 for line, code in zip(lines, codes)), lines, codes)
        """
    )
    result = await run_python_code(code, workspace, _forced(memory_mb=160, timeout_s=60))
    _ran_under_bwrap(result)
    if "cgroup" in (result.gaps or []):
        pytest.skip("no cgroup can be made here: memory is limited per process only")
    # Each child fits its own 160 MB address space; three of them do not fit one 160 MB budget.
    held = re.search(r"held together: (\d)", result.stdout)
    assert held is not None and int(held[1]) < 3, result.render()


@needs_root_and_bwrap
async def test_required_isolation_runs_under_bwrap_when_nothing_is_missing(workspace: Path) -> None:
    result = await run_python_code("print('ran')", workspace, _forced(isolation=Isolation.REQUIRED))
    _ran_under_bwrap(result)
    if result.gaps:
        assert "ran" not in result.stdout and "isolation is required but missing" in result.render()
    else:
        assert result.stdout.strip() == "ran"
