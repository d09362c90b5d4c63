"""What the built-in tool servers share: where the workspace is, path confinement, path scrubbing.

The pool tells a task-scoped server its task's workspace through the ``FLOWLLM_WORKSPACE`` environment variable
(a ``--workspace`` argument overrides it, handy when a server is started by hand); a server shared by the run
gets neither and is told each call's folder instead (``flowllm.tools.taskfolder``). The server process itself is
not started inside the workspace: files the task brought along (``json.py``, ``random.py``...) must not shadow
the modules the server imports.

Results must compare file by file between two runs in different folders, so nothing a tool returns may carry
the workspace's absolute path: paths are shown relative to it and ``scrub_workspace`` replaces whatever
absolute spelling slipped into free text (tracebacks, error messages) with ``.``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

WORKSPACE_ENV = "FLOWLLM_WORKSPACE"


class ConfinementError(ValueError):
    """A path that leaves the workspace (``..``, an absolute path elsewhere, a symlink pointing out)."""


def workspace_from(argv_value: str | None = None) -> Path | None:
    """The workspace: ``--workspace`` if given, else ``$FLOWLLM_WORKSPACE``, else none (a server shared by a run,
    whose calls each name their folder). Never the current folder: a shared server started from the project
    must not serve the project's files when a call names no folder."""
    raw = argv_value or os.environ.get(WORKSPACE_ENV)
    return Path(raw).expanduser().resolve() if raw else None


def add_workspace_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workspace",
        default=None,
        help=f"the task's folder (default: ${WORKSPACE_ENV}; without either, each call must name its folder)",
    )


def workspace_spellings(workspace: Path) -> list[str]:
    """Every absolute spelling of the workspace, longest first (``/tmp`` may really be ``/private/tmp``)."""
    spellings = {str(workspace), os.path.realpath(workspace), os.path.abspath(workspace)}
    return sorted((s for s in spellings if s and s != os.sep), key=len, reverse=True)


def scrub_workspace(text: str, workspace: Path | list[str]) -> str:
    """Replace the workspace's absolute path with ``.`` so results do not depend on where the task ran."""
    spellings = workspace if isinstance(workspace, list) else workspace_spellings(workspace)
    for spelling in spellings:
        if spelling in text:
            text = text.replace(spelling, ".")
    return text


def confine(workspace: Path, user_path: str) -> Path:
    """Resolve ``user_path`` inside ``workspace`` or raise ``ConfinementError`` with a clear reason.

    Relative paths are taken from the workspace; an absolute path is accepted only if it already lies inside
    it. Symlinks are followed and the *target* must stay inside too, so a link planted in the attachments
    cannot expose the rest of the machine.
    """
    text = (user_path or ".").strip()
    if "\x00" in text:
        raise ConfinementError("the path contains a NUL character")
    root = workspace.resolve()
    candidate = Path(text).expanduser()
    if not candidate.is_absolute():
        candidate = root / candidate
    # Lexical check first, so '../x' is refused even when it does not exist.
    lexical = Path(os.path.normpath(candidate))
    if not _inside(lexical, root) and not _inside(lexical, Path(os.path.abspath(workspace))):
        raise ConfinementError(f"'{text}' is outside the task folder; use a path relative to it, like 'data.csv'")
    resolved = lexical.resolve()
    if not _inside(resolved, root):
        raise ConfinementError(f"'{text}' is a symbolic link that points outside the task folder")
    return resolved


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def relative_display(path: Path, workspace: Path) -> str:
    """``path`` as the model should see it: relative to the workspace, with ``/`` separators."""
    try:
        rel = path.resolve().relative_to(workspace.resolve())
    except ValueError:
        rel = Path(os.path.relpath(path, workspace))
    text = rel.as_posix()
    return text if text else "."
