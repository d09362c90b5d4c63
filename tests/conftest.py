"""Fixtures several test folders share, and how the suite is split over test processes (pytest-xdist)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.experiment.helpers import run_flowllm

# Scopes whose fixtures a module's tests share: built once per test process.
SHARED_SCOPES = frozenset({"module", "package"})


def shares_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture built once for its module (a run, a server, a built wheel)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in SHARED_SCOPES for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` a module whose tests share a module-scoped fixture runs in one process, in
    file order: its fixture is built once, not once per process. Other tests are spread one by one."""
    for item in items:
        if not any(item.iter_markers("xdist_group")) and shares_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(Path(__file__).parent).as_posix()))


@pytest.fixture(scope="session")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's main job, run once (the offline sample): tests read it, and copy it before changing it."""
    run = tmp_path_factory.mktemp("sample") / "run"
    done = run_flowllm("progress=false", f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    return run
