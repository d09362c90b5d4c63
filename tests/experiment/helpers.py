"""Shared helpers of the experiment tests: the fixture datasets and the app in a subprocess."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from tests.appfork import AppProcess, run_app, start_app

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
GAIA = DATA / "gaia"
STANDARDIZED = DATA / "standardized"
SLOW = DATA / "slow"
# Test-only config groups, added to a run with hydra.searchpath (tools=sleep).
TEST_CONF = Path(__file__).resolve().parent / "conf"

# The fixture's task ids, by what the emulator makes of them (see data/gaia/script.yaml).
CSV_TASK = "8f1c2a4e-1d3b-4c55-9a0e-3f7b6c2d9e10"  # level 1, attachment, Python: correct
MATH_TASK = "2b7e9d10-6a4f-4e8b-b1c3-5d2f8a7e6c21"  # level 1, Python prints 150.0: correct by the number rule
MISSING_FILE_TASK = "c4d8e2f6-9b1a-4f3e-8d7c-1a2b3c4d5e6f"  # level 2, its attachment is not there: fails
LIST_TASK = "5e6f7a8b-2c3d-4e5f-9a0b-7c8d9e0f1a2b"  # level 2, no tools, a list: correct
WRONG_TASK = "9a0b1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"  # level 3, no tools: wrong answer


# The fixture's replies call run_python only: a run without the other default servers starts four processes
# fewer (about a CPU second each).
ONLY_PYTHON_TOOL = (
    "~tools.servers.tool-files",
    "~tools.servers.tool-math",
    "~tools.servers.tool-browse",
    "~tools.servers.tool-audio",
)


def gaia_overrides(*extra: str) -> list[str]:
    return [
        "+experiment=gaia",
        "progress=false",
        f"dataset.path={GAIA}",
        f"provider.emulator_script={GAIA / 'script.yaml'}",
        *extra,
    ]


def run_flowllm(
    *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python -m flowllm ARGS`` in a process of its own (forked with the app imported: tests/appfork.py)."""
    return run_app(list(args), cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout)


def start_flowllm(*args: str, log: Path, env: dict[str, str] | None = None) -> AppProcess | subprocess.Popen[Any]:
    """The app in the background, output to ``log`` (a pipe nobody reads could fill up and block it)."""
    with log.open("w") as handle:
        env = {**os.environ, **(env or {})}
        return start_app(list(args), cwd=ROOT, env=env, stdout=handle.fileno(), stderr=handle.fileno())
