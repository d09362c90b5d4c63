"""Fixtures several test folders share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.experiment.helpers import run_flowllm


@pytest.fixture(scope="session")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's main job, run once (the offline sample): tests read it, and copy it before changing it."""
    run = tmp_path_factory.mktemp("sample") / "run"
    done = run_flowllm("progress=false", f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    return run
