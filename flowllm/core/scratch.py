"""Scratch folders in the system's temporary folder that a killed process does not leave behind.

Each is named ``<prefix><pid>-XXXXXXXX``: the process that made it is in its name. A ``with`` block removes its
folder when it ends, but a SIGKILL (an out-of-memory kill, a cluster's preemption, ``kill -9``) ends no block, so
making one first removes the folders of the same prefix whose process is gone. A folder of a running process,
this one's included, is never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["new_scratch", "scratch", "sweep_stale"]


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    except OSError:
        return True  # not known: kept
    return True


def sweep_stale(prefix: str, base: Path | None = None) -> None:
    """Remove the folders ``<prefix><pid>-*`` under ``base`` (the temporary folder) whose process is gone."""
    folder = Path(base or tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            owner = entry.name[len(prefix) :].split("-", 1)[0]
            if owner.isdigit() and not _alive(int(owner)):
                shutil.rmtree(entry.path, ignore_errors=True)


def new_scratch(prefix: str, base: Path | None = None) -> Path:
    """A new empty folder ``<prefix><pid>-XXXXXXXX`` (private to this user), after sweeping dead processes' ones;
    the caller removes it."""
    sweep_stale(prefix, base)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))


@contextlib.contextmanager
def scratch(prefix: str, base: Path | None = None) -> Iterator[Path]:
    """``new_scratch`` for the length of a ``with`` block: removed when it ends, whatever ends it."""
    folder = new_scratch(prefix, base)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
