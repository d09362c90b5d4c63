"""Scratch folders that a SIGKILLed process does not leave behind (flowllm/core/scratch.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flowllm.core.scratch import new_scratch, scratch

PREFIX = "flowllm-test-scratch-"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_process_folder_is_removed_and_a_live_one_kept(tmp_path: Path) -> None:
    dead = tmp_path / f"{PREFIX}{_dead_pid()}-abcd"
    (dead / "inner").mkdir(parents=True)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = tmp_path / f"{PREFIX}{alive.pid}-abcd"
        running.mkdir()
        mine = tmp_path / f"{PREFIX}{os.getpid()}-abcd"
        mine.mkdir()
        other = tmp_path / f"other-{_dead_pid()}-abcd"  # another prefix: not ours to remove
        other.mkdir()
        made = new_scratch(PREFIX, tmp_path)
        assert made.is_dir() and made.name.startswith(f"{PREFIX}{os.getpid()}-")
        assert not dead.exists()
        assert running.is_dir() and mine.is_dir() and other.is_dir()
    finally:
        alive.kill()
        alive.wait()


def test_the_with_block_removes_its_folder_whatever_ends_it(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), scratch(PREFIX, tmp_path) as folder:
        (folder / "file").write_text("x")
        raise RuntimeError("boom")
    assert not folder.exists()


def test_a_sigkilled_process_folder_goes_with_the_next_one(tmp_path: Path) -> None:
    """The case a ``with`` block cannot cover: the process is killed inside it."""
    code = (
        "import sys, time; from pathlib import Path; from flowllm.core.scratch import scratch\n"
        f"with scratch({PREFIX!r}, Path(sys.argv[1])) as f:\n"
        "    print(f, flush=True); time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    left = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert left.is_dir()  # what a killed process leaves
    with scratch(PREFIX, tmp_path) as folder:
        assert not left.exists() and folder.is_dir()
