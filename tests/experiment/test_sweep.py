"""Sweeps: the comparison built from job folders, a real joblib multirun, a local Ray instance, SLURM config."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from omegaconf import DictConfig

from flowllm.engine.recorder import read_json
from flowllm.rundir.layout import SWEEP_PLOT_FILE, SWEEP_SUMMARY_FILE, SWEEP_TABLE_FILE
from flowllm.sweep.summary import build_sweep_summary, collect, main
from tests.appfork import run_app
from tests.experiment.helpers import GAIA, LIST_TASK, ROOT, WRONG_TASK, gaia_overrides, run_flowllm

pytestmark = pytest.mark.long

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _job(sweep: Path, name: str, overrides: list[str], summary: dict | None) -> None:
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if summary is not None:
        (job / "summary.json").write_bytes(orjson.dumps(summary))


def _summary(accuracy: float, cost: float | None, interrupted: bool = False) -> dict:
    return {
        "tasks": 10,
        "correct": int(accuracy * 10),
        "completed": 10,
        "failed": 0,
        "accuracy": accuracy,
        "parse_rate": 0.9,
        "usage": {"input_tokens": 1000, "output_tokens": 100, "cache_read_tokens": 10},
        "cost_usd": cost,
        "wall_seconds": 3.5,
        "interrupted": interrupted,
        "provider": "p",
        "model": "m",
    }


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "multirun"
    common = ["+experiment=gaia", "dataset.limit=10"]
    _job(root, "0", [*common, "provider=claude", "repair=full"], _summary(0.6, 0.42))
    _job(root, "1", [*common, "provider=claude", "repair=strict"], _summary(0.5, 0.40, interrupted=True))
    failed = {"status": "error", "error": "OPENAI_API_KEY is not set"}
    _job(root, "2", [*common, "provider=gpt5", "repair=full"], failed)
    _job(root, "10", [*common, "provider=gpt5", "repair=strict"], None)  # still running
    return root


def test_collect_reads_every_job_folder(sweep: Path) -> None:
    summary = collect(sweep)
    assert [j.job for j in summary.jobs] == ["0", "1", "2", "10"]  # numeric job order, not "10" < "2"
    assert [j.status for j in summary.jobs] == ["ok", "interrupted", "error", "unfinished"]
    assert summary.common_overrides == ["+experiment=gaia", "dataset.limit=10"]
    assert summary.jobs[0].label == "provider=claude repair=full"  # only what tells the jobs apart
    assert summary.jobs[0].accuracy == 0.6 and summary.jobs[0].cost_usd == 0.42
    assert summary.jobs[2].error == "OPENAI_API_KEY is not set"
    data = summary.to_dict()
    assert data["counts"] == {"ok": 1, "interrupted": 1, "budget": 0, "error": 1, "unfinished": 1}
    assert data["best"]["label"] == "provider=claude repair=full"


def test_cli_rebuilds_the_summary_from_job_folders(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(sweep)]) == 0
    printed = capsys.readouterr().out
    assert "provider=claude repair=full" in printed and "60.0% (6/10)" in printed and "$0.42" in printed
    saved = read_json(sweep / SWEEP_SUMMARY_FILE)
    assert len(saved["jobs"]) == 4 and saved["files"]["table"] == SWEEP_TABLE_FILE
    table = (sweep / SWEEP_TABLE_FILE).read_text()
    row = "| 0 | - | provider=claude repair=full | ok | 60.0% (6/10) | - | 90.0% | 1,000 | 100 | $0.4200 | 3.5s |"
    assert row in table
    assert "error: OPENAI_API_KEY is not set" in table
    if HAS_MATPLOTLIB:
        assert (sweep / SWEEP_PLOT_FILE).read_bytes().startswith(b"\x89PNG")
    assert main([str(sweep), "--no-plot"]) == 0


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([str(tmp_path)]) == 2
    assert "no job folders" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib (the plot extra) is not installed")
def test_plot_falls_back_to_tokens_when_a_model_is_unpriced(tmp_path: Path) -> None:
    root = tmp_path / "m"
    _job(root, "0", ["provider=a"], _summary(0.5, None))
    _job(root, "1", ["provider=b"], _summary(0.7, 0.1))
    summary = build_sweep_summary(root)
    assert summary.files["plot"] == SWEEP_PLOT_FILE and (root / SWEEP_PLOT_FILE).stat().st_size > 1000


def _multirun(sweep_dir: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_flowllm("-m", "progress=false", f"hydra.sweep.dir={sweep_dir}", *extra, env=env, timeout=900)


def test_joblib_multirun_over_offline_providers(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = _multirun(
        sweep_dir,
        "+experiment=smoke",  # the bundled sample; the bundle switches the sweep summary callback on
        "dataset.task_ids=[sample-03-percentage,sample-09-arithmetic]",
        "~tools.servers.tool-python",  # both tasks only need the calculator
        "~tools.servers.tool-files",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        # Two offline wire protocols; a provider whose key is missing is refused before any job (below).
        "provider=offline,offline_chat",
        env={"ANTHROPIC_API_KEY": ""},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = read_json(sweep_dir / SWEEP_SUMMARY_FILE)
    jobs = {j["label"]: j for j in summary["jobs"]}
    assert set(jobs) == {"provider=offline", "provider=offline_chat"}
    for label in ("provider=offline", "provider=offline_chat"):
        job = jobs[label]
        assert job["status"] == "ok" and job["accuracy"] == 1.0 and job["tasks"] == 2, job
        assert job["parse_rate"] == 1.0 and job["cost_usd"] > 0 and job["input_tokens"] > 0
    assert summary["counts"] == {"ok": 2, "interrupted": 0, "budget": 0, "error": 0, "unfinished": 0}
    assert "provider=offline_chat" in proc.stdout  # the comparison table, printed at the end
    # A line per job as it starts and as it ends (from the job's own process, under joblib too).
    lines = [line for line in proc.stderr.splitlines() if line.startswith("sweep job ")]
    for provider in ("offline", "offline_chat"):
        mine = [line for line in lines if re.search(rf"provider={provider}[ )]", line)]
        assert any(line.endswith(": running") for line in mine), (provider, lines)
    assert any("provider=offline_chat" in line and ": done, 2/2 correct (100.0%), $" in line for line in lines), lines
    assert (sweep_dir / SWEEP_TABLE_FILE).is_file()
    if HAS_MATPLOTLIB:
        assert (sweep_dir / SWEEP_PLOT_FILE).read_bytes().startswith(b"\x89PNG")
    # The jobs' own folders are enough to rebuild it.
    (sweep_dir / SWEEP_SUMMARY_FILE).unlink()
    rebuilt = run_app(
        [str(sweep_dir), "--no-plot"], module="flowllm.sweep.summary", cwd=ROOT, env=dict(os.environ), timeout=600
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert read_json(sweep_dir / SWEEP_SUMMARY_FILE)["jobs"] == summary["jobs"]


def test_a_joblib_sweep_with_a_job_missing_its_key_starts_no_job(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = _multirun(
        sweep_dir,
        "+experiment=smoke",
        "dataset.task_ids=[sample-03-percentage]",
        "hydra/launcher=joblib",
        "provider=offline,claude",
        env={"ANTHROPIC_API_KEY": ""},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flowllm: error:")]
    assert len(errors) == 1 and "ANTHROPIC_API_KEY" in errors[0] and "provider=claude" in errors[0], proc.stderr
    assert not sweep_dir.exists()


@pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None or importlib.util.find_spec("ray") is None,
    reason="the ray extra (hydra-ray-launcher, ray) is not installed",
)
def test_ray_local_launcher_sweep() -> None:
    # Ray's unix socket paths must stay under 108 bytes: a short folder of our own, not pytest's deep tmp_path.
    sweep_dir = Path(tempfile.mkdtemp(prefix="flowllm-ray-"))
    try:
        proc = _multirun(
            sweep_dir,
            "+experiment=gaia",
            f"dataset.path={GAIA}",
            f"provider.emulator_script={GAIA / 'script.yaml'}",
            f"dataset.task_ids=[{LIST_TASK},{WRONG_TASK}]",  # answered without tools
            "tools=none",
            "hydra/launcher=ray_local",
            "hydra.launcher.ray.init.num_cpus=2",
            "provider=offline,offline_responses",
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        jobs = read_json(sweep_dir / SWEEP_SUMMARY_FILE)["jobs"]
        assert [(j["label"], j["status"], j["accuracy"]) for j in jobs] == [
            ("provider=offline", "ok", 0.5),
            ("provider=offline_responses", "ok", 0.5),
        ]
        # Ray kept its session files inside the sweep folder.
        assert any((sweep_dir / ".ray").glob("session_*"))
    finally:
        shutil.rmtree(sweep_dir, ignore_errors=True)


Compose = Callable[..., DictConfig]


def test_launcher_configs_compose(composed: Compose, tmp_path: Path) -> None:
    cfg = composed(["hydra/launcher=joblib"], hydra=True)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
        slurm = composed(["hydra/launcher=slurm", "hydra.launcher.partition=cpu"], hydra=True).hydra.launcher
        assert slurm._target_.endswith("SlurmLauncher")
        assert slurm.partition == "cpu" and slurm.timeout_min == 240 and slurm.cpus_per_task == 4
        assert str(slurm.submitit_folder).endswith(".submitit/%j")
    if importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is not None:
        local = composed(["hydra/launcher=ray_local", f"hydra.sweep.dir={tmp_path}"], hydra=True).hydra.launcher
        assert local._target_.endswith("RayLauncher")
        init = local.ray.init
        assert init._node_ip_address == "127.0.0.1" and init.include_dashboard is False
        assert init._temp_dir == os.fspath(tmp_path.resolve() / ".ray")
        cluster = composed(["hydra/launcher=ray_cluster"], hydra=True).hydra.launcher
        assert cluster.ray.remote.max_retries == 0


def test_a_job_whose_folder_holds_other_settings_stops_the_sweep_before_any_job(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    base = gaia_overrides("tools=none", f"dataset.task_ids=[{LIST_TASK}]")
    earlier = run_flowllm(*base, "repair=full", f"hydra.run.dir={sweep_dir / '1'}")
    assert earlier.returncode == 0, earlier.stderr[-2000:]
    saved = (sweep_dir / "1" / "summary.json").read_bytes()
    proc = _multirun(sweep_dir, *base, "repair=strict,none")
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flowllm: error:")]
    assert errors and all(line.endswith("(job 1 (repair=none))") for line in errors), errors
    assert "hydra.sweep.dir" in errors[0]
    assert any("repair.name: 'full' before, 'none' now" in line for line in errors), errors
    assert not (sweep_dir / "0").exists()  # job 0 never ran
    assert (sweep_dir / "1" / "summary.json").read_bytes() == saved
