"""A built wheel carries what a run needs (configs, the bundled sample, its emulator script) and runs from any
folder: `pip install .` is as good as `pip install -e .`.

The wheel is built from this checkout and unpacked into a folder of its own, which goes first on PYTHONPATH;
the run starts in an empty folder outside the source tree, so nothing can be found by accident in the checkout.
The dependencies are this environment's (installing them again would only measure the package index).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (built,) = out.glob("flowllm-*.whl")
    return built


def test_the_wheel_holds_the_configs_and_the_sample(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "flowllm/conf/config.yaml",
        "flowllm/conf/provider/offline.yaml",
        "flowllm/conf/pipeline/agent_turn.yaml",
        "flowllm/data/sample/metadata.jsonl",
        "flowllm/data/sample/script.yaml",
        "flowllm/py.typed",
    ):
        assert needed in names, needed
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)


def test_the_installed_wheel_runs_the_sample_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import flowllm, sys; sys.stdout.write(flowllm.__file__)"
    where = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowllm",
            "progress=false",
            "dataset.task_ids=[sample-03-percentage]",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert (summary["tasks"], summary["completed"], summary["correct"]) == (1, 1, 1)
    assert list(elsewhere.iterdir()) == []  # nothing written where the user happened to stand
