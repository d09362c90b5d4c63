"""The child processes of a run's workers, whoever starts them (the local pool or a Ray task): a worker dies with
the process that started it, and is told its shard by one override."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SHARD_KEY = "experiment.worker_shard"


def quoted(value: str) -> str:
    """A value for a Hydra override, whatever characters it holds."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def shard_override(shard_path: Path) -> str:
    return f"{SHARD_KEY}={quoted(str(shard_path))}"


def die_with(parent_pid: int) -> Callable[[], None] | None:
    """Run in the child before exec: SIGKILL when the parent dies (Linux), even if it already has."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the forked child only calls it

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec
