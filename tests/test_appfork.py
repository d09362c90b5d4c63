"""The tests' forked ``python -m`` (tests/appfork.py) behaves as a subprocess does: its own working folder,
environment, arguments, output, exit code and pid; a signal ends it with a negative code; a timeout kills it; it
exits as an interpreter exits. The launcher a forked app starts its Python children with (tests/applaunch.py)
stands in for the module it has forked: streams, signals, exit status, and its death ends the module too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.appfork import ROOT, _zygote, run_app, start_app

PROBE = "tests.appfork_probe"


def test_a_forked_run_has_its_own_folder_environment_arguments_output_and_exit_code(tmp_path: Path) -> None:
    env = {**os.environ, "PROBE": "one", "PYTHONPATH": str(ROOT)}
    done = run_app(["exit", "7"], module=PROBE, cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 7
    seen = json.loads(done.stdout)
    assert seen["cwd"] == str(tmp_path) and seen["argv"] == ["exit", "7"] and seen["probe"] == "one"
    assert seen["pid"] != os.getpid() and done.stderr == "to stderr\n"
    again = run_app(["exit", "0"], module=PROBE, cwd=tmp_path, env={**env, "PROBE": "two"}, timeout=60)
    assert again.returncode == 0 and json.loads(again.stdout)["probe"] == "two"  # nothing kept from the first


def test_a_signal_ends_it_as_it_ends_a_subprocess_and_a_timeout_kills_it(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with log.open("w") as handle:
        proc = start_app(
            ["sleep"], module=PROBE, cwd=ROOT, env=dict(os.environ), stdout=handle.fileno(), stderr=handle.fileno()
        )
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    with pytest.raises(subprocess.TimeoutExpired):
        run_app(["sleep"], module=PROBE, cwd=ROOT, env=dict(os.environ), timeout=1)


def test_poll_sees_an_app_that_ended(tmp_path: Path) -> None:
    """``poll()`` (a wait of 0 s) once never read the exit status: a loop waiting for a file while asserting the
    app still runs spun until its own deadline after the app had failed."""
    log = tmp_path / "log"
    with log.open("w") as handle:
        proc = start_app(
            ["exit", "3"],
            module=PROBE,
            cwd=tmp_path,
            env=dict(os.environ),
            stdout=handle.fileno(),
            stderr=handle.fileno(),
        )
    deadline = time.monotonic() + 60
    while proc.poll() is None:
        assert time.monotonic() < deadline, "poll() did not see the app end"
        time.sleep(0.01)
    assert proc.returncode == 3


def test_it_exits_as_an_interpreter_does_without_its_teardown(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_app(["atexit"], module=PROBE, cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "handler ran"  # atexit ran, output flushed
    failed = run_app(["raise"], module=PROBE, cwd=tmp_path, env=env, timeout=60)
    assert failed.returncode == 1 and "RuntimeError: probe failed" in failed.stderr
    interrupted = run_app(["interrupt"], module=PROBE, cwd=tmp_path, env=env, timeout=60)
    assert interrupted.returncode == -signal.SIGINT and "KeyboardInterrupt" in interrupted.stderr


# ----- the launcher: the interpreter a forked app starts its Python children with (tests/applaunch.py) ----------
def _launch(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    launcher = os.path.join(os.path.dirname(_zygote().path), "python")
    return subprocess.Popen(
        [launcher, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,  # type: ignore[call-overload]
    )


def _gone(pid: int) -> bool:
    """Whether the process ``pid`` has ended, waiting for it up to a minute."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_the_launcher_forks_a_module_with_its_streams_folder_and_environment(tmp_path: Path) -> None:
    proc = _launch("-m", PROBE, "echo", stdin=subprocess.PIPE, cwd=tmp_path, env={**os.environ, "PROBE": "launched"})
    out, err = proc.communicate("from stdin\n", timeout=60)
    seen = json.loads(out.splitlines()[0])
    assert proc.returncode == 0 and out.splitlines()[1] == "from stdin" and err == "to stderr\n"
    assert seen["cwd"] == str(tmp_path) and seen["probe"] == "launched" and seen["argv"] == ["echo"]
    assert seen["pid"] != proc.pid  # forked by the zygote, not the launcher's own process
    code = _launch("-m", PROBE, "exit", "9")
    code.communicate(timeout=60)
    assert code.returncode == 9


def test_the_launcher_passes_signals_on_and_ends_as_its_module_ended() -> None:
    proc = _launch("-m", PROBE, "sleep")
    assert proc.stdout is not None
    pid = json.loads(proc.stdout.readline())["pid"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == -signal.SIGTERM and _gone(pid)


def test_a_launcher_killed_takes_its_module_with_it() -> None:
    proc = _launch("-m", PROBE, "sleep")
    assert proc.stdout is not None
    pid = json.loads(proc.stdout.readline())["pid"]
    proc.kill()
    assert proc.wait(60) == -signal.SIGKILL
    assert _gone(pid)  # the zygote ended it: no module outlives the process that stands in for it


def test_the_launcher_runs_anything_else_with_the_real_interpreter() -> None:
    proc = _launch("-c", "import sys; print(sys.executable)")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == sys.executable
