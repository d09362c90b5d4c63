"""A replay of a replay, from another folder than the one the saved replay was started in.

A replay records ``provider.run_dir`` as it was typed, often relative to the folder it was started in; the run it
names is found there (Hydra's ``runtime.cwd`` in the replay's ``.hydra/hydra.yaml``). It was looked for in the
folder of the new command, so a replay of a replay, or of a fork, failed unless started where its saved run was.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.appfork import run_app
from tests.replay.runs import CLEAN_TASK, RUN_TIMEOUT_S, _env

TASK = f"dataset.task_ids=[{CLEAN_TASK}]"


def _run(cwd: Path, *args: str) -> None:
    done = run_app(["progress=false", TASK, *args], cwd=cwd, env=_env(), timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_replay_of_a_replay_finds_the_first_run_from_anywhere(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    _run(project, "hydra.run.dir=runs/base")
    _run(project, "provider=replay", "provider.run_dir=runs/base", "hydra.run.dir=runs/replay")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert not (elsewhere / "runs" / "base").exists()
    again = tmp_path / "again"
    _run(elsewhere, "provider=replay", f"provider.run_dir={project / 'runs' / 'replay'}", f"hydra.run.dir={again}")
    result = (again / "tasks" / CLEAN_TASK / "result.json").read_text()
    assert '"status": "exact"' in result and '"correct": true' in result
    assert os.listdir(elsewhere) == []
