"""A bundle of a run its budget stopped: the replay stops where the saved run stopped (the composition matrix
checks that such bundles reproduce), so a stopped task whose saved result was edited, behind a rewritten
manifest, is found by the replay. One task at a time, so the budget stops the same task every time."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from flowllm.bundle.archive import GZIP, write_bundle
from flowllm.bundle.cli import verify_main
from flowllm.bundle.make import make_bundle
from flowllm.bundle.manifest import MANIFEST_FILE, MANIFEST_HASH_FILE, sha256
from flowllm.exit_codes import ExitCode
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import RunSummary
from tests.bundle.test_bundle import unpacked
from tests.experiment.helpers import run_flowllm

# What this calls in process may start `python -m flowllm` (a bundle's replay, a bisect's forks): forked.
pytestmark = pytest.mark.usefixtures("forked_python")

MATRIX = Path(__file__).resolve().parents[1] / "verify" / "data" / "matrix"
STOPPED = "sample-02-word-count"  # the task the budget stops, after its first turn


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("budget") / "run"
    done = run_flowllm(
        "progress=false",
        f"dataset.path={MATRIX}",
        "experiment.max_concurrent=1",
        "experiment.budget.cost_usd=0.01",
        "provider=offline",
        f"provider.emulator_script={MATRIX / 'script.yaml'}",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == ExitCode.BUDGET, done.stderr[-2000:]
    return run


def test_an_edited_budget_stopped_task_does_not_reproduce(
    stopped_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    budget = RunSummary.from_dict(orjson.loads(RunLayout(stopped_run).summary.read_bytes())).budget
    assert budget is not None and list(budget.stopped_tasks) == [STOPPED] and budget.not_started > 0
    make_bundle(stopped_run, tmp_path / "run.tar.zst")
    files = unpacked(tmp_path / "run.tar.zst", tmp_path / "edit")
    name = f"runs/run/tasks/{STOPPED}/result.json"
    files[name] = files[name].replace(b'"status": "budget"', b'"status": "completed"')
    manifest = orjson.loads(files[MANIFEST_FILE])
    manifest["files"][name] = sha256(files[name])
    files[MANIFEST_FILE] = orjson.dumps(manifest, option=orjson.OPT_INDENT_2)
    files[MANIFEST_HASH_FILE] = (sha256(files[MANIFEST_FILE]) + "\n").encode()
    edited = tmp_path / "edited.tar.gz"
    write_bundle(edited, files.items(), GZIP)
    assert verify_main([str(edited), "--dataset", str(MATRIX)]) == ExitCode.UNVERIFIED
    out = capsys.readouterr().out
    assert f"task {STOPPED}: {name} says status 'completed', the replay gives" in out, out
    assert "sample-01-csv-revenue" not in out  # the task nobody edited reproduced
