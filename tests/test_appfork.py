"""The tests' forked ``python -m`` (tests/appfork.py) behaves as a subprocess does: its own working folder,
environment, arguments, output, exit code and pid; a signal ends it with a negative code; a timeout kills it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.appfork import ROOT, run_app, start_app

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
