from __future__ import annotations

from pathlib import Path

import pytest

from tests.export.runs import export_run


@pytest.fixture(scope="session")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run (two tasks, a sub-agent), made once per session; tests must not change it."""
    return export_run(tmp_path_factory.mktemp("export-run")).check().run_dir
