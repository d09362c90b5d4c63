"""``TurnDirs``: the turn folders a replay reads, spelled once per turn, naming exactly what ``RunLayout`` names."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowllm.rundir.layout import OUTPUT_FILE, RunLayout, TurnDirs, nested_scope, subagent_scope


@pytest.mark.parametrize(
    ("task_id", "scope", "epoch"),
    [
        ("plain-task", "", None),
        ("plain-task", "", 3),
        ("a/b: an id that cannot name a folder", "", None),
        ("plain-task", subagent_scope(2, "browser", "call_7"), None),
        ("plain-task", nested_scope(subagent_scope(1, "coder", "c1"), 4, "compaction"), 2),
    ],
)
def test_node_files_are_the_layouts_paths(tmp_path: Path, task_id: str, scope: str, epoch: int | None) -> None:
    layout = RunLayout(tmp_path / "run")
    dirs = TurnDirs(layout)
    assert dirs.conversation(task_id, scope, epoch) == str(layout.conversation(task_id, scope, epoch))
    for turn in (1, 12):
        assert dirs.turn(task_id, turn, scope, epoch) == str(layout.turn(task_id, turn, scope, epoch))
        for index, name in ((3, "call_model"), (11, "dispatch_tools")):
            expected = str(layout.node(task_id, turn, index, name, scope, epoch) / OUTPUT_FILE)
            assert dirs.node_file(task_id, turn, index, name, OUTPUT_FILE, scope, epoch) == expected


def test_it_keeps_a_bounded_number_of_conversations(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    dirs = TurnDirs(layout, kept=4)
    for task in range(10):
        for turn in (1, 2):
            assert dirs.turn(f"t{task}", turn) == str(layout.turn(f"t{task}", turn))
    assert len(dirs) <= 4
    # A conversation asked again after the cache started over is spelled the same.
    assert dirs.turn("t0", 1) == str(layout.turn("t0", 1))
