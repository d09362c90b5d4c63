"""Where tasks' workspaces live while their code runs: outside the run directory.

A workspace inside ``<run dir>/tasks/<id>/`` put the run's answer-bearing files one ``../`` away from
model-written code: ``../../../.hydra/config.yaml`` names the dataset, ``../../<other task>/result.json`` can
be rewritten. So a running task's workspace is ``<tmp>/flowllm-workspaces-<pid>-XXXX/<task folder>`` (the root
is ``0711``: a sandbox uid can reach its own workspace by path but list nothing), and when the attempt ends the
workspace moves to ``tasks/<id>/workspace``, where it is kept for reading. A task that never used its folder
(no attachment, no tool that works in it) has none to keep. Roots of runs that died (their pid is gone) are
removed when the next run makes its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from flowllm.core.scratch import new_scratch

PREFIX = "flowllm-workspaces-"


def _skip_special(folder: str, names: list[str]) -> list[str]:
    """Names ``copytree`` must not copy: FIFOs, sockets, devices (the code may make them; copying one blocks)."""
    skipped = []
    for name in names:
        with contextlib.suppress(OSError):
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                skipped.append(name)
    return skipped


class WorkspaceRoot:
    """One run's workspace folder, made on first use and removed by ``close``."""

    def __init__(self, base: Path | None = None) -> None:
        self.base = Path(base or tempfile.gettempdir())
        self._root: Path | None = None

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = new_scratch(PREFIX, self.base)  # dead runs' roots removed first
            os.chmod(self._root, 0o711)
        return self._root

    def fresh(self, name: str) -> Path:
        """Where the task folder ``name`` works, empty: an earlier attempt's folder (not kept) is removed.

        The folder itself is made by the first thing that needs it (an attachment copied in, a task's own tool
        server starting, a call to a tool that works in the folder: ``flowllm.tools.client``), not here: a task
        that never touches it costs no folder (creating one takes a few hundred microseconds of kernel time on
        some disks), and its run folder holds no empty ``workspace/``.
        """
        workspace = self.root / name
        if os.path.lexists(workspace):
            shutil.rmtree(workspace, ignore_errors=True)
        return workspace

    def keep_by_rename(self, name: str, target: Path) -> bool:
        """``keep`` done with one rename, when it can be (``target`` absent, its parent made if need be): a few
        system calls, cheap enough for the event loop. False when it takes ``keep``: ``target`` exists, or the
        run directory is on another filesystem."""
        source = self.root / name
        try:
            os.rename(source, target)
            return True
        except FileNotFoundError:
            if not source.is_dir():
                return True  # gone: nothing to keep
        except OSError:
            return False
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(source, target)
            return True
        except OSError:
            return False

    def keep(self, name: str, target: Path) -> None:
        """Move the workspace of ``name`` to ``target`` (replacing what is there); nothing to do if it is gone."""
        source = self.root / name
        if not source.is_dir():
            return
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(source, target)
        except OSError:  # another filesystem: copy (links as links, no FIFOs), then remove
            shutil.copytree(source, target, symlinks=True, ignore=_skip_special)
            shutil.rmtree(source, ignore_errors=True)

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
