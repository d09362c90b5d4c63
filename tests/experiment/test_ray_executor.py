"""experiment.executor=ray: the workers of one run as Ray tasks, on a local Ray instance (127.0.0.1) here. The
results are those of one process, file by file (the workers run in scratch folders and send their tasks back);
without Ray installed the setting is refused with the install line. A cluster of separate nodes:
test_ray_cluster.py."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flowllm.engine.recorder import read_json
from tests.experiment.helpers import ONLY_PYTHON_TOOL, gaia_overrides, run_flowllm
from tests.experiment.test_workers import HANG_GUARD_S, assert_same_runs

pytestmark = pytest.mark.long

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="the ray extra is not installed (pip install 'flowllm[ray]')")


@needs_ray
def test_ray_workers_give_the_same_results_as_one_process(tmp_path: Path) -> None:
    def one(extra: tuple[str, ...]) -> Path:
        run_dir = tmp_path / ("ray" if extra else "one")
        proc = run_flowllm(*gaia_overrides(*extra, f"hydra.run.dir={run_dir}", *ONLY_PYTHON_TOOL), timeout=HANG_GUARD_S)
        assert proc.returncode == 3, proc.stdout + proc.stderr  # the fixture's task with a missing attachment
        return run_dir

    with ThreadPoolExecutor(2) as pool:
        single, ray = pool.map(one, ((), ("experiment.executor=ray", "experiment.workers=2")))
    assert_same_runs(single, ray)
    assert read_json(ray / "summary.json")["status"] == "finished"


def test_without_ray_the_executor_is_refused_with_the_install_line(tmp_path: Path) -> None:
    # Where Ray is installed, a package of that name that fails to import stands for its absence.
    shadow = tmp_path / "no-ray" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    proc = run_flowllm(
        *gaia_overrides("experiment.executor=ray", f"hydra.run.dir={tmp_path / 'run'}"),
        env={"PYTHONPATH": str(shadow.parent)},
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "experiment.executor=ray needs Ray: pip install 'flowllm[ray]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unknown_executor_is_one_line() -> None:
    proc = run_flowllm(*gaia_overrides("experiment.executor=slurm"), timeout=HANG_GUARD_S)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "experiment.executor" in proc.stderr and "local" in proc.stderr and "ray" in proc.stderr
