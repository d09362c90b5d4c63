"""A task's workspace: empty for each attempt, made by the first thing that needs it, then moved into the run
directory, by one rename when it can."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from flowllm.run.workspaces import WorkspaceRoot


def _base(tmp_path: Path) -> Path:
    base = tmp_path / "tmp"  # the system's temporary folder in a run
    base.mkdir()
    return base


def _made(root: WorkspaceRoot, name: str) -> Path:
    """A fresh workspace that something used (a tool made it)."""
    workspace = root.fresh(name)
    workspace.mkdir()
    return workspace


def test_fresh_starts_empty_even_after_an_earlier_attempt(tmp_path: Path) -> None:
    root = WorkspaceRoot(tmp_path)
    first = _made(root, "t1")
    (first / "left.txt").write_text("x")
    again = root.fresh("t1")
    assert again == first and not again.exists()  # the earlier attempt's is gone; the folder waits to be made
    root.close()
    assert not any(tmp_path.iterdir())


def test_a_workspace_nothing_made_is_nothing_to_keep(tmp_path: Path) -> None:
    root = WorkspaceRoot(_base(tmp_path))
    assert not root.fresh("t1").exists()
    target = tmp_path / "run" / "tasks" / "t1" / "workspace"
    assert root.keep_by_rename("t1", target)
    assert not target.exists() and not target.parent.exists()  # no empty workspace/, no folder made for it
    root.keep("t1", target)
    assert not target.exists()


def test_keep_by_rename_moves_and_makes_the_parent(tmp_path: Path) -> None:
    root = WorkspaceRoot(_base(tmp_path))
    (_made(root, "t1") / "out.txt").write_text("kept")
    target = tmp_path / "run" / "tasks" / "t1" / "workspace"  # no task folder yet (snapshot=none)
    assert root.keep_by_rename("t1", target)
    assert (target / "out.txt").read_text() == "kept" and not (root.root / "t1").exists()
    assert root.keep_by_rename("t1", target)  # already moved: nothing to keep, nothing changed
    assert (target / "out.txt").read_text() == "kept"


def test_a_target_that_holds_files_is_left_to_keep(tmp_path: Path) -> None:
    root = WorkspaceRoot(_base(tmp_path))
    (_made(root, "t1") / "new.txt").write_text("new")
    target = tmp_path / "workspace"
    target.mkdir()
    (target / "old.txt").write_text("old")
    assert not root.keep_by_rename("t1", target)  # a rename cannot replace a folder with files in it
    root.keep("t1", target)
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]


def test_another_filesystem_is_left_to_keep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = WorkspaceRoot(_base(tmp_path))
    (_made(root, "t1") / "a.txt").write_text("a")

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "rename", cross_device)
    target = tmp_path / "run" / "workspace"
    assert not root.keep_by_rename("t1", target)
    root.keep("t1", target)  # copied, then removed
    assert (target / "a.txt").read_text() == "a" and not (root.root / "t1").exists()
