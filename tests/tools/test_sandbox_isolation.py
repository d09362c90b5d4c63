"""run_python as a hostile model would use it: keys, answers, escapes, bombs. Each attack must come back empty.

The isolation needs root (or delegated namespaces); where the machine cannot give a part of it, the result
names the gap and the test for that part is skipped with that reason, so a skip is visible, never a pass.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flowllm.tools.sandbox import cgroup
from flowllm.tools.sandbox.execute import Isolation, SandboxLimits, SandboxResult, run_python_code, sandbox_uid
from tests.tools.helpers import needs_proc

CANARY = "sk-canary-0123456789abcdef0123456789"
PROJECT = Path(__file__).resolve().parents[2]


async def _run(code: str, workspace: Path, **limits: object) -> SandboxResult:
    return await run_python_code(textwrap.dedent(code), workspace, SandboxLimits(**limits))  # type: ignore[arg-type]


def _require(result: SandboxResult, *parts: str) -> None:
    missing = [p for p in parts if p in (result.gaps or [])]
    if result.gaps is None or missing:
        pytest.skip(f"this machine cannot give the sandbox: {missing or 'a report'}")


@needs_proc
async def test_the_code_cannot_read_our_environment_or_any_process_environ(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    monkeypatch.setenv("SOME_SERVICE_TOKEN", CANARY + "-token")
    code = f"""
    import os
    print(dict(os.environ))
    seen = []
    for pid in [{os.getpid()}, {os.getppid()}, os.getppid(), 1, *(p for p in os.listdir('/proc') if p.isdigit())]:
        try:
            seen.append(open(f'/proc/{{pid}}/environ', 'rb').read().decode(errors='replace'))
        except OSError as exc:
            seen.append(type(exc).__name__)
    print(seen)
    """
    result = await _run(code, workspace)
    assert result.ok, result.render()
    assert CANARY not in result.render()
    assert "OPENAI_API_KEY" not in result.render()
    _require(result, "privileges", "pid namespace")
    assert "'PATH'" in result.stdout and "environ" not in result.stdout.split("]")[-1]


async def test_the_code_sees_neither_the_run_directory_nor_the_dataset_nor_the_project(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("dataset: /somewhere\n")
    workspace = run_dir / "tasks" / "t1" / "workspace"
    workspace.mkdir(parents=True)
    (run_dir / "tasks" / "t2").mkdir(parents=True)
    (run_dir / "tasks" / "t2" / "result.json").write_text('{"correct": false}')
    code = f"""
    import os
    for path in ['../../../.hydra/config.yaml', {str(run_dir / ".hydra" / "config.yaml")!r},
                 {str(PROJECT / "pyproject.toml")!r}]:
        try:
            print('READ', open(path).read())
        except OSError as exc:
            print('refused', type(exc).__name__)
    for path in ['../../t2/result.json', {str(run_dir / "tasks" / "t2" / "result.json")!r},
                 {str(PROJECT / "flowllm" / "planted.py")!r}]:
        try:
            open(path, 'w').write('{{"correct": true}}')
            print('WROTE', path)
        except OSError as exc:
            print('refused', type(exc).__name__)
    """
    result = await _run(code, workspace)
    assert result.ok, result.render()
    _require(result, "filesystem")
    assert "READ" not in result.stdout and "WROTE" not in result.stdout
    assert result.stdout.count("refused") == 6
    assert (run_dir / "tasks" / "t2" / "result.json").read_text() == '{"correct": false}'
    assert not (PROJECT / "flowllm" / "planted.py").exists()


async def test_the_code_cannot_signal_the_flowllm_process(workspace: Path) -> None:
    hits: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    try:
        code = f"""
        import os, signal
        for pid in ({os.getpid()}, {os.getppid()}):
            try:
                os.kill(pid, signal.SIGUSR1)
                print('SENT', pid)
            except OSError as exc:
                print('refused', type(exc).__name__)
        """
        result = await _run(code, workspace)
        await asyncio.sleep(0.05)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    _require(result, "privileges", "pid namespace")
    assert "SENT" not in result.stdout and hits == []


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in cmdline and state != "Z":
                found.append(int(entry))
    return found


@needs_proc
async def test_a_double_forked_setsid_child_dies_with_the_call(workspace: Path) -> None:
    marker = f"flowllm-escape-{os.getpid()}"
    code = f"""
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])
        os._exit(0)
    time.sleep(0.3)
    print('started')
    """
    result = await _run(code, workspace)
    assert result.ok, result.render()
    if result.gaps is None or {"pid namespace", "cgroup"} <= set(result.gaps):
        pytest.skip("neither a PID namespace nor a cgroup here: a setsid child can leave the session")
    for _ in range(100):
        if not _processes_with(marker):
            break
        await asyncio.sleep(0.05)
    assert _processes_with(marker) == []


async def test_a_fork_bomb_is_capped(workspace: Path) -> None:
    code = """
    import os, time
    made = 0
    for _ in range(500):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
    print('made', made)
    """
    result = await _run(code, workspace, max_processes=16, timeout_s=60)
    assert result.ok, result.render()
    made = int(result.stdout.split()[-1])
    assert made < 24  # the cap (plus the cgroup's few spare slots for the bootstrap), not 500


async def test_memory_is_limited_for_the_code_and_its_children_together(workspace: Path) -> None:
    code = """
    import subprocess, sys
    child = "b = b'x' * (100 << 20); import time; time.sleep(1); print('held')"
    procs = [subprocess.Popen([sys.executable, '-c', child], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    print([p.communicate()[0].strip() for p in procs])
    """
    result = await _run(code, workspace, memory_mb=160, timeout_s=60)
    _require(result, "cgroup")
    # Each child fits its own 160 MB address space; three of them do not fit one 160 MB budget.
    assert result.stdout.count("held") < 3, result.render()


async def test_the_workspace_cannot_grow_past_its_cap(workspace: Path) -> None:
    code = """
    import os
    for i in range(200):
        with open(f'f{i}.bin', 'wb') as fh:
            fh.write(os.urandom(1 << 20) * 4)
    print('wrote all')
    """
    result = await _run(code, workspace, max_workspace_mb=12, max_file_mb=5, timeout_s=60)
    assert result.workspace_exceeded and "wrote all" not in result.stdout
    assert "grew past 12 MB" in result.render()
    big = await _run("open('big.bin', 'wb').write(b'x' * (6 << 20))", workspace, max_file_mb=5)
    assert "File too large" in big.stderr
    assert (workspace / "big.bin").stat().st_size <= 5 << 20


async def test_required_isolation_refuses_to_run_when_a_part_is_missing(workspace: Path) -> None:
    probe = await _run("print(1)", workspace)
    if probe.gaps is None:
        pytest.skip("the sandbox gave no report")
    result = await _run("print('ran')", workspace, isolation=Isolation.REQUIRED)
    if probe.gaps:
        assert "ran" not in result.stdout and "isolation is required but missing" in result.render()
    else:
        assert result.stdout.strip() == "ran"


@needs_proc
def test_a_server_killed_mid_call_leaves_no_process_home_or_cgroup(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = f"flowllm-orphan-{os.getpid()}"
    script = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from flowllm.tools.sandbox.execute import SandboxLimits, run_python_code
        code = "import time, sys; open('started', 'w').close(); time.sleep(60)  # {marker}"
        asyncio.run(run_python_code(code, Path({str(workspace)!r}), SandboxLimits(timeout_s=60)))
        """
    )
    server = subprocess.Popen([sys.executable, "-c", script], env={**os.environ})
    try:
        for _ in range(600):
            if (workspace / "started").exists():
                break
            assert server.poll() is None
            import time

            time.sleep(0.05)
        server.kill()
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    # One call afterwards sweeps what a dead server left (home folders, cgroups named after its pid).
    asyncio.run(run_python_code("print(1)", workspace))
    import tempfile
    import time

    for _ in range(100):
        if not _processes_with("time.sleep(60)  # " + marker):
            break
        time.sleep(0.05)
    assert _processes_with("time.sleep(60)  # " + marker) == []
    leftovers = [p.name for p in Path(tempfile.gettempdir()).glob(f"flowllm-sandbox-home-{server.pid}-*")]
    assert leftovers == []
    parents = [cgroup._v2_parent(), cgroup._v1_parent("memory"), cgroup._v1_parent("pids")]
    for parent in (p for p in parents if p is not None):
        assert list(parent.glob(f"flowllm-sandbox-{server.pid}-*")) == []


def test_sandbox_uids_are_unprivileged_and_per_server() -> None:
    assert sandbox_uid() >= 1_000_000 and sandbox_uid() != os.getuid()
