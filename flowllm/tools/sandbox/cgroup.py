"""A control group per ``run_python`` call: one memory budget and one process cap for the code and all its children.

``RLIMIT_AS`` bounds each process on its own (three children under "2 GB" could hold 6 GB between them) and
``RLIMIT_NPROC`` counts per user, so the sandbox asks the kernel for a cgroup where it can: cgroup v2 when the
``memory`` and ``pids`` controllers are delegated to our cgroup, else the v1 ``memory`` and ``pids``
hierarchies (what Docker gives a root container). The group is also the sandbox's kill switch: every process
in it dies with the call, even one that left its session (``setsid``) and its parent.

Where no cgroup can be made (an unprivileged user without delegation), ``create`` returns None and the caller
falls back to per-process limits (and says so).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "flowllm-sandbox-"


@dataclass
class Cgroup:
    """One call's group: a folder per hierarchy it spans (one under v2, ``memory`` and ``pids`` under v1)."""

    folders: list[Path]
    memory_bytes: int
    max_pids: int

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join (the sandbox's bootstrap does)."""
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError):
                found.update(int(line) for line in (folder / "cgroup.procs").read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL every process in the group (``cgroup.kill`` where v2 has it, else one by one until empty)."""
        for folder in self.folders:
            kill_file = folder / "cgroup.kill"
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
        for _ in range(200):  # a process forking while we kill: a few rounds always empty the group
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and delete the group's folders."""
        self.kill()
        for folder in self.folders:
            for _ in range(100):  # rmdir fails while the last killed process is still being torn down
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in ``controller``'s v1 hierarchy, or in the v2 one for ``""``."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controller == "" and controllers == "") or controller in controllers.split(","):
            return path
    return None


def _v2_parent() -> Path | None:
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        return None
    own = _own_path("")
    if own is None:
        return None
    parent = CGROUP_ROOT / own.lstrip("/")
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    return parent if {"memory", "pids"} <= set(enabled) else None


def _v1_parent(controller: str) -> Path | None:
    own = _own_path(controller)
    base = CGROUP_ROOT / controller
    if own is None or not base.is_dir():
        return None
    parent = base / own.lstrip("/")
    return parent if parent.is_dir() and os.access(parent, os.W_OK) else None


def _sweep(parent: Path) -> None:
    """Remove groups left by a tool server that was killed mid-call (its pid is in the name and is gone)."""
    with contextlib.suppress(OSError):
        for folder in parent.glob(f"{PREFIX}*"):
            owner = folder.name[len(PREFIX) :].split("-", 1)[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                stale = Cgroup([folder], 0, 0)
                stale.remove()


def _make(parent: Path, name: str, settings: dict[str, str]) -> Path | None:
    _sweep(parent)
    folder = parent / name
    try:
        folder.mkdir()
    except OSError:
        return None
    try:
        for file, value in settings.items():
            if (folder / file).exists():
                (folder / file).write_text(value)
    except OSError:
        Cgroup([folder], 0, 0).remove()
        return None
    return folder


def create(name: str, memory_bytes: int, max_pids: int) -> Cgroup | None:
    """A new group named ``flowllm-sandbox-<our pid>-<name>`` with these limits (``0``: none), or None."""
    if not os.path.isdir(CGROUP_ROOT) or (memory_bytes <= 0 and max_pids <= 0):
        return None
    full = f"{PREFIX}{os.getpid()}-{name}"
    memory = str(memory_bytes) if memory_bytes > 0 else "max"
    pids = str(max_pids) if max_pids > 0 else "max"
    parent = _v2_parent()
    if parent is not None:
        folder = _make(parent, full, {"memory.max": memory, "memory.swap.max": "0", "pids.max": pids})
        return Cgroup([folder], memory_bytes, max_pids) if folder else None
    memory_parent, pids_parent = _v1_parent("memory"), _v1_parent("pids")
    if memory_parent is None or pids_parent is None:
        return None
    v1_memory = str(memory_bytes) if memory_bytes > 0 else "-1"
    mem = _make(
        memory_parent,
        full,
        {"memory.limit_in_bytes": v1_memory, "memory.memsw.limit_in_bytes": v1_memory, "memory.swappiness": "0"},
    )
    if mem is None:
        return None
    pid_folder = _make(pids_parent, full, {"pids.max": pids})
    if pid_folder is None:
        Cgroup([mem], 0, 0).remove()
        return None
    return Cgroup([mem, pid_folder], memory_bytes, max_pids)
