"""A plug-in package adds a repair stage and a scorer that ``+experiment`` configs can name.

The package (tests/data/plugin_pkg) is installed with pip, offline, into a temporary folder put on PYTHONPATH;
the offline smoke experiment then runs in a subprocess with overrides naming the plug-in's stage and scorer,
and the run folder shows that both acted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_SOURCE = ROOT / "tests" / "data" / "plugin_pkg"
STAGE = "stamped_strict"  # the plug-in's names (its pyproject.toml)
SCORER = "casefold"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the plug-in is installed; the source is copied first, so the build leaves nothing in the repo."""
    base = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN_SOURCE, base / "source")
    target = base / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet"]
    done = subprocess.run(
        [*pip, "--target", str(target), str(source)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return target


def _flowllm(plugin_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(plugin_path), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "flowllm", "+experiment=smoke", "progress=false", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
    )


def test_a_plugins_repair_stage_and_scorer_act_in_a_run(plugin_path: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = _flowllm(
        plugin_path, f"repair.stages=[{STAGE},strict,lenient]", f"dataset.scorer={SCORER}", f"hydra.run.dir={run}"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["scorer"] == SCORER
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((run / "tasks").glob("*/result.json"))]
    assert len(results) == 2
    # The stage read the calls' clean arguments before the built-in strict stage could: they are recorded under it.
    assert summary["repairs"].get(STAGE, 0) > 0 and "strict" not in summary["repairs"]
    # The plug-in's scorer gives a verdict (the built-in gaia scorer gives none), matching what it decided.
    assert [r["verdict"] for r in results] == ["correct" if r["correct"] else "incorrect" for r in results]


def test_a_misspelt_plugin_name_is_refused_with_the_closest_choice(plugin_path: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = _flowllm(plugin_path, f"dataset.scorer={SCORER}t", f"hydra.run.dir={run}")
    assert done.returncode == 2
    assert (
        f"dataset.scorer must be one of gaia, exact, judge, {SCORER}, not '{SCORER}t' (did you mean '{SCORER}'?)"
        in done.stderr
    )
    assert not (run / "tasks").exists()
