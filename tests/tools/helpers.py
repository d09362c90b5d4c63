"""Helpers for the tool tests: configs for the real servers and a /proc walk to find leftover processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

FLAKY_SERVER = Path(__file__).parent / "servers" / "flaky_server.py"


def descendants(pid: int | None = None) -> set[int]:
    """Live (non-zombie) descendants of ``pid`` (default: this process), from /proc."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        state, ppid = fields[0], int(fields[1])
        if state != "Z":
            children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    live = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].split()[0] != "Z":
            live.add(pid)
    return live


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="process checks read /proc (Linux)")


def flaky_config(state_dir: Path, **server: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "command": "python",
        "args": [str(FLAKY_SERVER)],
        "env": {"FLAKY_STATE": str(state_dir)},
        "timeout_s": 30,
    }
    entry.update(server)
    return {"name": "test", "servers": {"flaky": entry}, "max_result_chars": 2000}


def builtin_config() -> dict[str, Any]:
    return {
        "name": "builtin",
        "servers": {
            "tool-python": {"command": "python", "args": ["-m", "flowllm.tools.python", "--timeout-s", "5"]},
            "tool-files": {"command": "python", "args": ["-m", "flowllm.tools.files"]},
            "tool-math": {"command": "python", "args": ["-m", "flowllm.tools.math"]},
        },
    }


ROOT = Path(__file__).resolve().parents[2]
LOOPBACK_PRELOAD = Path(__file__).parent / "servers" / "loopback.cjs"
# Installed by .ci/run (`npm install --prefix .ci-npm ...`, pinned): the reference server nobody here wrote.
EVERYTHING = ROOT / ".ci-npm" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"


def everything_or_skip() -> Path:
    import shutil

    if shutil.which("node") is None:
        pytest.skip("node is not installed: the npm server-everything tests need it")
    if not EVERYTHING.is_file():
        pytest.skip(f"{EVERYTHING.relative_to(ROOT)} is missing: run `npm install --prefix .ci-npm` as .ci/run does")
    return EVERYTHING
