"""The sweep summary's statistics: each job's interval, each job against the baseline paired task by task with
Holm-corrected p-values (checked against exact McNemar by hand), the Pareto frontier, and a baseline that names
no job (one line, exit 2)."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from flowllm.engine.recorder import read_json
from flowllm.errors import ConfigError
from flowllm.exit_codes import ExitCode, sweep_exit_code
from flowllm.rundir.layout import SWEEP_PLOT_FILE, SWEEP_SUMMARY_FILE, SWEEP_TABLE_FILE
from flowllm.scoring.stats import TaskScore, estimate
from flowllm.sweep.stats import pareto_front, resolve_baseline
from flowllm.sweep.summary import collect, main, table_rows
from tests.experiment.helpers import run_flowllm

N = 40


def _mcnemar(b: int, c: int) -> float:
    n = b + c
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n)


def _job(sweep: Path, name: str, overrides: list[str], correct: list[bool], cost: float) -> None:
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    for i, ok in enumerate(correct):
        task = job / "tasks" / f"t{i:02d}"
        task.mkdir(parents=True)
        result = {"task_id": f"t{i:02d}", "status": "completed", "correct": ok, "turns": 1, "answer": "x"}
        (task / "result.json").write_bytes(orjson.dumps(result))
    est = estimate([TaskScore(f"t{i}", float(ok)) for i, ok in enumerate(correct)]).to_dict()
    summary = {
        "tasks": len(correct),
        "correct": sum(correct),
        "completed": len(correct),
        "failed": 0,
        "accuracy": sum(correct) / len(correct),
        "usage": {"input_tokens": 1000, "output_tokens": 100},
        "cost_usd": cost,
        "wall_seconds": 1.0,
        "interrupted": False,
        "stats": {"accuracy": est},
    }
    (job / "summary.json").write_bytes(orjson.dumps(summary))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "multirun"
    base = [i < 20 for i in range(N)]  # 50%
    better = [i < 20 or i >= 32 for i in range(N)]  # fixes 8 tasks: 70%
    mixed = [(i < 18) or (20 <= i < 23) for i in range(N)]  # breaks 2, fixes 3: 52.5%
    _job(root, "0", ["model=a"], base, 1.0)
    _job(root, "1", ["model=b"], better, 2.0)
    _job(root, "2", ["model=c"], mixed, 3.0)  # dearer and worse than b: off the frontier
    return root


def test_jobs_against_the_baseline_with_holm(sweep: Path) -> None:
    summary = collect(sweep)
    assert summary.baseline == "0"
    base, better, mixed = summary.jobs
    assert base.vs_baseline is None
    assert better.vs_baseline is not None and mixed.vs_baseline is not None
    assert better.vs_baseline["diff"] == pytest.approx(0.2) and better.vs_baseline["n"] == N
    assert (better.vs_baseline["fixed"], better.vs_baseline["broken"]) == (8, 0)
    p_better, p_mixed = _mcnemar(0, 8), _mcnemar(2, 3)
    assert better.vs_baseline["p_value"] == pytest.approx(p_better)
    assert mixed.vs_baseline["p_value"] == pytest.approx(p_mixed)
    # Holm over two comparisons: the smaller p doubled, the larger max(that, itself), capped at 1.
    assert better.vs_baseline["p_holm"] == pytest.approx(min(1.0, 2 * p_better))
    assert mixed.vs_baseline["p_holm"] == pytest.approx(min(1.0, max(2 * p_better, p_mixed)))
    assert better.vs_baseline["significant_after_holm"] is True
    assert mixed.vs_baseline["verdict"].startswith("not distinguishable from noise")
    assert [j.job for j in summary.jobs if j.pareto] == ["0", "1"]


def test_a_job_its_budget_cut_short_is_said_and_kept_off_the_frontier(sweep: Path) -> None:
    """A job its budget ended ran 10 of the 40 tasks, all right, for a quarter of the cost: it was "ok", "best" and
    on the cost-accuracy frontier, cheaper for having run fewer tasks. It is now "budget", its accuracy says what
    it left out, it is paired with the baseline on the tasks both ran, and the frontier compares whole jobs."""
    _job(sweep, "3", ["model=d"], [True] * 10, 0.25)
    path = sweep / "3" / "summary.json"
    cut = {**read_json(path), "tasks": N, "unfinished": N - 10}
    cut["budget"] = {"cost_usd": 0.25, "ended_run": True, "reason": "the run spent $0.2500 of its $0.25"}
    path.write_bytes(orjson.dumps(cut))
    summary = collect(sweep)
    job = summary.jobs[3]
    assert (job.status, job.unfinished, job.pareto) == ("budget", N - 10, False)
    assert job.vs_baseline is not None and job.vs_baseline["n"] == 10  # paired on the tasks it ran
    data = summary.to_dict()
    assert data["counts"]["budget"] == 1 and data["best"]["job"] == "1" and data["pareto_front"] == ["0", "1"]
    assert "n=10, 30 unfinished, not counted" in table_rows(summary)[3][4]
    assert sweep_exit_code([j.to_dict() for j in summary.jobs]) == ExitCode.BUDGET


def test_a_job_with_unscored_tasks_says_so_beside_its_interval(sweep: Path) -> None:
    """A replay job that re-scores a saved run with another repair stage: the tasks that diverged are not scored, so
    its interval is over fewer tasks. The interval replaced the accuracy cell, and "N unscored" with it."""
    _job(sweep, "3", ["repair=strict"], [True] * 37, 0.0)
    path = sweep / "3" / "summary.json"
    path.write_bytes(orjson.dumps({**read_json(path), "tasks": N, "scored": 37, "unscored": 3}))
    assert table_rows(collect(sweep))[3][4].endswith("n=37, 3 unscored")


def test_files_show_intervals_comparisons_and_the_frontier(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(sweep)]) == 0
    printed = capsys.readouterr().out
    assert "baseline: job 0" in printed
    table = (sweep / SWEEP_TABLE_FILE).read_text()
    assert "50.0% ± 8.0 [35.2, 64.8] n=40" in table  # Wilson, 20 of 40; SE sqrt(.25 * 40/39 / 40)
    assert "| baseline |" in table
    assert "+20.0 [7.0, 33.0] p=0.00781 (Holm 0.0156)" in table  # SE sqrt(6.4/39/40), t with 39 df
    saved = read_json(sweep / SWEEP_SUMMARY_FILE)
    half = 2.022691 * math.sqrt((8 * 0.8**2 + 32 * 0.2**2) / 39 / 40)  # t(39)'s 97.5% point
    assert saved["baseline"] == "0" and saved["pareto_front"] == ["0", "1"]
    assert saved["jobs"][1]["vs_baseline"]["ci95"] == [
        pytest.approx(0.2 - half, abs=1e-6),
        pytest.approx(0.2 + half, abs=1e-6),
    ]
    assert (sweep / SWEEP_PLOT_FILE).read_bytes().startswith(b"\x89PNG")


def test_baseline_by_number_or_override(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert collect(sweep, baseline="model=b").baseline == "1"
    assert collect(sweep, baseline="2").baseline == "2"
    jobs = [("0", ["x=1", "y=1"]), ("1", ["x=1", "y=2"])]
    with pytest.raises(ConfigError, match="names 2 jobs"):
        resolve_baseline("x=1", jobs)
    assert main([str(sweep), "--baseline", "model=zzz", "--no-plot"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sweep.baseline=model=zzz names no job" in err[0]
    # Not strict (a job refreshing the summary): the comparison is left out and the reason kept.
    summary = collect(sweep, baseline="9")
    assert summary.baseline is None and "names no job" in (summary.baseline_error or "")


def test_pareto_front() -> None:
    points = [(1.0, 0.5), (2.0, 0.7), (3.0, 0.6), (2.0, 0.7), (0.5, 0.2)]
    assert pareto_front(points) == [4, 0, 1, 3]


def test_a_real_sweep_refuses_a_baseline_that_names_no_job_before_its_first_job(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = run_flowllm(
        "-m",
        "progress=false",
        f"hydra.sweep.dir={sweep_dir}",
        "+experiment=smoke",
        "dataset.task_ids=[sample-09-arithmetic]",
        "~tools.servers.tool-python",
        "~tools.servers.tool-files",
        "provider=offline,offline_chat",
        'sweep.baseline="provider=nope"',
        timeout=600,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flowllm: error:")]
    assert errors == [
        "flowllm: error: sweep.baseline=provider=nope names no job of the sweep (jobs: 0, 1; or one of their overrides)"
    ]
    assert not sweep_dir.exists()  # refused by the check before the first job: no job ran
