"""``python -m flowllm experiment.epochs=N`` on the offline sample: epochs in their own folders, the summary's
stats, resuming only the missing epochs, replaying each epoch from its own folder, the paired diff of two runs,
power from a saved run, and the one-line refusals (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flowllm.inspect.cli import main as inspect_main
from tests.experiment.helpers import run_flowllm

TASKS = "dataset.task_ids=[sample-01-csv-revenue,sample-02-word-count,sample-07-department]"
IDS = ("sample-01-csv-revenue", "sample-02-word-count", "sample-07-department")


@pytest.fixture(scope="module")
def epochs_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("epochs") / "run"
    proc = run_flowllm("experiment.epochs=3", TASKS, "progress=false", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accuracy ± SE [95% CI]" in proc.stdout
    assert "100.0% ± 0.0 [43.9, 100.0] n=3 (wilson interval, CLT SE)" in proc.stdout
    assert "100.0% ± not known, 95% CI not known, n=1" in proc.stdout  # level 2 has one task
    assert "pass@k" in proc.stdout and "k=3: 100.0%" in proc.stdout
    return run_dir


def test_each_epoch_has_its_own_folder_and_the_task_its_reduced_score(epochs_run: Path) -> None:
    for task_id in IDS:
        task = epochs_run / "tasks" / task_id
        assert not list(task.glob("turn_*"))  # the records are the epochs'
        for epoch in (1, 2, 3):
            folder = task / "epochs" / str(epoch)
            assert (folder / "result.json").is_file() and list(folder.glob("turn_*/*_call_model"))
            assert json.loads((folder / "result.json").read_text())["correct"] is True
        result = json.loads((task / "result.json").read_text())
        assert result["epochs"] == 3 and result["epoch_reducer"] == "mean" and result["score"] == 1.0
        assert [e["epoch"] for e in result["epoch_log"]] == [1, 2, 3]
        epoch_tokens = sum(
            json.loads((task / "epochs" / str(n) / "result.json").read_text())["usage"]["input_tokens"]
            for n in (1, 2, 3)
        )
        assert result["usage"]["input_tokens"] == epoch_tokens  # spent over all epochs


def test_the_summary_holds_stats(epochs_run: Path) -> None:
    stats = json.loads((epochs_run / "summary.json").read_text())["stats"]
    acc = stats["accuracy"]
    assert (acc["n"], acc["epochs"], acc["mean"], acc["interval"]) == (3, 3, 1.0, "wilson")
    assert acc["ci95"] == [pytest.approx(0.438503, abs=1e-6), 1.0]  # Wilson, 3 of 3
    assert acc["within_task_var"] == 0.0  # the emulator answers every epoch alike
    assert stats["pass_at_k"] == {"1": 1.0, "2": 1.0, "3": 1.0}
    assert set(stats["by_level"]) == {"1", "2"}
    assert stats["by_level"]["2"]["n"] == 1 and stats["by_level"]["2"]["ci95"] is None  # one task: not known


def _model_calls(run_dir: Path) -> int:
    lines = (run_dir / "usage.jsonl").read_text().splitlines()
    return sum(1 for line in lines if json.loads(line).get("type") == "attempt")


def test_a_rerun_runs_only_the_missing_epoch(epochs_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(epochs_run, run_dir)
    task = run_dir / "tasks" / IDS[0]
    kept = (task / "epochs" / "1" / "result.json").read_bytes()
    kept_mtime = (task / "epochs" / "1" / "result.json").stat().st_mtime_ns
    shutil.rmtree(task / "epochs" / "2")
    (task / "result.json").unlink()  # as a crash during epoch 2 leaves it
    before = _model_calls(run_dir)
    proc = run_flowllm("experiment.epochs=3", TASKS, "progress=false", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (task / "epochs" / "1" / "result.json").read_bytes() == kept
    assert (task / "epochs" / "1" / "result.json").stat().st_mtime_ns == kept_mtime
    assert (task / "epochs" / "2" / "result.json").is_file()
    new_calls = _model_calls(run_dir) - before
    turns = json.loads((task / "epochs" / "2" / "result.json").read_text())["turns"]
    assert new_calls == turns  # one epoch of one task ran again, nothing else
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed"] == 2 and summary["stats"]["accuracy"]["n"] == 3


def test_a_replay_serves_each_epoch_from_its_own_folder(epochs_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "replay"
    proc = run_flowllm(
        "provider=replay",
        f"provider.run_dir={epochs_run}",
        "experiment.epochs=3",
        TASKS,
        "progress=false",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["replay"]["exact"] == 3
    for task_id in IDS:
        for epoch in (1, 2, 3):
            a = epochs_run / "tasks" / task_id / "epochs" / str(epoch)
            b = run_dir / "tasks" / task_id / "epochs" / str(epoch)
            assert sorted(p.name for p in a.glob("turn_*")) == sorted(p.name for p in b.glob("turn_*"))
            assert json.loads((b / "result.json").read_text())["replay"]["status"] == "exact"


def test_diff_and_power_from_saved_runs(epochs_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one"
    proc = run_flowllm(TASKS, "progress=false", f"hydra.run.dir={one}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert inspect_main(["diff", str(one), str(epochs_run), "--json"]) == 0
    paired = json.loads(capsys.readouterr().out)["paired"]
    assert (paired["n"], paired["diff"], paired["unchanged"], paired["test"]) == (3, 0.0, 3, "mcnemar-exact")
    assert paired["p_value"] == 1.0 and paired["verdict"].startswith("not distinguishable from noise")
    assert inspect_main(["diff", str(one), str(epochs_run)]) == 0
    out = capsys.readouterr().out
    assert "paired comparison" in out and "fixed / broken / unchanged" in out and "0 / 0 / 3" in out
    assert inspect_main(["power", "--run", str(epochs_run), "--delta", "0.05", "--baseline", "0.6", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    summary = json.loads((epochs_run / "summary.json").read_text())
    per_task_epoch = summary["cost_usd"] / (3 * 3)
    assert plan["epochs"] == 3 and plan["cost_per_task_epoch_usd"] == pytest.approx(
        per_task_epoch, abs=1e-6
    )  # shown to the micro-dollar
    assert plan["cost_per_run_usd"] == pytest.approx(per_task_epoch * plan["tasks"] * 3, rel=1e-5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["experiment.epochs=0"], "experiment.epochs must be at least 1, not 0"),
        (["stats.cluster_by=topic"], "stats.cluster_by: the dataset has no field 'topic'"),
        (["experiment.epoch_reducer=median"], "epoch_reducer"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(overrides: list[str], message: str, tmp_path: Path) -> None:
    proc = run_flowllm(*overrides, "progress=false", f"hydra.run.dir={tmp_path}", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert not (tmp_path / "tasks").exists()


def test_diff_of_runs_without_a_common_task_is_refused(
    epochs_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    (other / "tasks" / "elsewhere").mkdir(parents=True)
    (other / "tasks" / "elsewhere" / "result.json").write_text(
        json.dumps({"task_id": "elsewhere", "status": "completed", "correct": True, "turns": 1})
    )
    (other / "summary.json").write_text(json.dumps({"tasks": 1}))
    assert inspect_main(["diff", str(epochs_run), str(other)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no task in common" in err


def test_more_epochs_run_only_the_new_ones_and_fewer_drop_the_rest(epochs_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(epochs_run, run_dir)
    kept = {t: (run_dir / "tasks" / t / "epochs" / "3" / "result.json").read_bytes() for t in IDS}
    before = _model_calls(run_dir)
    proc = run_flowllm("experiment.epochs=4", TASKS, "progress=false", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    new_turns = 0
    for task_id in IDS:
        task = run_dir / "tasks" / task_id
        assert (task / "epochs" / "3" / "result.json").read_bytes() == kept[task_id]
        new_turns += json.loads((task / "epochs" / "4" / "result.json").read_text())["turns"]
        assert json.loads((task / "result.json").read_text())["epochs"] == 4
    assert _model_calls(run_dir) - before == new_turns  # only the fourth epochs ran
    assert json.loads((run_dir / "summary.json").read_text())["stats"]["epochs"] == 4
    proc = run_flowllm("experiment.epochs=2", TASKS, "progress=false", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for task_id in IDS:
        epochs = sorted(p.name for p in (run_dir / "tasks" / task_id / "epochs").iterdir())
        assert epochs == ["1", "2"]
        assert len(json.loads((run_dir / "tasks" / task_id / "result.json").read_text())["epoch_log"]) == 2


@pytest.mark.parametrize(
    ("epochs", "fork", "message"),
    [
        (1, False, "the saved run ran 3 epochs, this one 1: a replay serves each epoch from the saved run's record"),
        (1, True, "the saved run ran 3 epochs, this one 1: a replay serves each epoch from the saved run's record"),
        (4, False, "has no reply for epoch 4 or later: set experiment.epochs=3 or fewer, or fork"),
    ],
)
def test_a_replay_of_other_epochs_than_its_saved_run_is_refused(
    epochs_run: Path, tmp_path: Path, epochs: int, fork: bool, message: str
) -> None:
    """With another experiment.epochs (named, or an experiment's default: +experiment=... replays as composed),
    every task once failed as missing, "the new pipeline took another path earlier", and the accuracy was unknown."""
    forking = ["provider.fork=live", "provider.live=offline"] if fork else []
    replay = ["provider=replay", f"provider.run_dir={epochs_run}", *forking, TASKS, "progress=false"]
    proc = run_flowllm(*replay, f"experiment.epochs={epochs}", f"hydra.run.dir={tmp_path / 'refused'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "refused" / "tasks").exists()


def test_a_fork_may_run_more_epochs_than_its_saved_run_live(epochs_run: Path, tmp_path: Path) -> None:
    fork = ["provider=replay", f"provider.run_dir={epochs_run}", "provider.fork=live", "provider.live=offline"]
    proc = run_flowllm(*fork, "experiment.epochs=4", TASKS, "progress=false", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for task_id in IDS:
        verdicts = [
            json.loads((tmp_path / "tasks" / task_id / "epochs" / str(n) / "result.json").read_text())["replay"]
            for n in (1, 2, 3, 4)
        ]
        assert [v["status"] for v in verdicts] == ["exact", "exact", "exact", "forked"]
        assert verdicts[3]["turn"] == 1 and verdicts[3]["live_calls"] > 0
