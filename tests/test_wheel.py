"""A built wheel carries what a run needs (configs, the bundled sample, its emulator script) and runs from any
folder: `pip install .` is as good as `pip install -e .`.

The wheel is built from this checkout and installed by pip (no index, no dependencies) into a fresh venv; its
metadata must declare every dependency of pyproject.toml. The run starts in an empty folder outside the source
tree, with that venv's interpreter, so nothing can be found by accident in the checkout. The dependencies are
this environment's, reached through a ``.pth`` file of the venv that comes after the venv's own site-packages
(installing them again would only measure the package index).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import orjson
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy of what the wheel is made of: setuptools writes build/ and an egg-info next to the
    # sources, which must not land in the checkout (another test process may be building at the same time).
    source = out / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "flowllm", source / "flowllm", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
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
        "flowllm/inspect/templates/report.html",  # the report's page, read as package data
        "flowllm/rundir/schema/summary.schema.json",  # the run files' JSON Schema (flowllm/rundir/schema_gen.py)
        "flowllm/rundir/schema/result.schema.json",
        "flowllm/rundir/schema/usage-line.schema.json",
        "flowllm/tools/child/sandbox_boot.py",  # run_python's bootstrap, handed to the child as text
        "flowllm/tools/child/reader_worker.py",
    ):
        assert needed in names, needed
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)


def _requirement(text: str) -> tuple[str, str, frozenset[str]]:
    req = Requirement(text)
    return canonicalize_name(req.name), str(req.specifier), frozenset(req.extras)


def _installed(wheel: Path, venv: Path) -> tuple[Path, Path]:
    """The wheel installed by pip into a fresh venv: its interpreter and its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    python = venv / "bin" / "python"
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps"]
    subprocess.run([*pip, "--find-links", str(wheel.parent), str(wheel)], check=True, capture_output=True, timeout=300)
    code = "import sysconfig, sys; sys.stdout.write(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True, timeout=60).stdout
    return python, Path(site)


def test_the_installed_wheel_runs_the_sample_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python, site = _installed(wheel, venv)
    assert site.resolve().is_relative_to(venv.resolve()), site
    (dist,) = metadata.distributions(name="flowllm", path=[str(site)])
    assert all(Path(dist.locate_file(f)).resolve().is_relative_to(venv.resolve()) for f in dist.files or ())
    # The metadata declares every dependency, as pyproject.toml spells it (no extra, no marker).
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    required = {_requirement(r) for r in dist.requires or () if Requirement(r).marker is None}
    missing = [r for r in declared if _requirement(r) not in required]
    assert missing == [], f"not in the wheel's Requires-Dist: {missing}"

    # Then this environment's packages after the venv's own (the wheel's files must still come from the venv).
    here = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "_test_dependencies.pth").write_text("".join(f"{path}\n" for path in here))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    code = "import flowllm, sys; sys.stdout.write(flowllm.__file__)"
    where = subprocess.run([python, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout).resolve().is_relative_to(site.resolve()), where.stdout + where.stderr
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            str(python),
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
