"""``experiment.shard=I/N`` and ``flowllm merge``: four shards of the offline sample, run as separate processes
and merged, equal one run of the sample task by task, and the merge verifies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flowllm.cli.merge import main as merge_main
from flowllm.datasets.shards import shard_of
from flowllm.run.report import headline_accuracy
from flowllm.rundir.layout import RESULT_FILE, RunLayout
from flowllm.rundir.results import RunSummary
from flowllm.verify.cli import main as verify_main
from tests.experiment.helpers import run_flowllm, start_flowllm

SHARDS = 4
SAME_FIGURES = ("tasks", "finished", "completed", "failed", "correct", "scored", "accuracy", "turns", "tool_calls")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The offline sample as four shards, four processes at once, each into its own folder (and, beside them, a
    fifth process given a shard out of range)."""
    root = tmp_path_factory.mktemp("shards")
    folders = [root / f"shard{i}" for i in range(SHARDS + 1)]
    procs = [
        start_flowllm(
            "progress=false", f"experiment.shard={i}/{SHARDS}", f"hydra.run.dir={folder}", log=root / f"{i}.log"
        )
        for i, folder in enumerate(folders)
    ]
    codes = [proc.wait(timeout=600) for proc in procs]
    for i, code in enumerate(codes[:SHARDS]):
        assert code == 0, (root / f"{i}.log").read_text()[-2000:]
    assert codes[SHARDS] == 2
    return folders


@pytest.fixture(scope="module")
def merged(shards: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("merged") / "run"
    done = run_flowllm("merge", *map(str, reversed(shards[:SHARDS])), "-o", str(out))  # any order
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{out}: 10 tasks, 10 completed" in done.stdout
    # Its accuracy said as the run's console says it (over the scored tasks, naming the unscored ones), not bare.
    assert f"accuracy {headline_accuracy(_summary(out))}, $" in done.stdout
    return out


def _summary(run: Path) -> RunSummary:
    return RunSummary.from_dict(json.loads(RunLayout(run).summary.read_text()))


def test_each_shard_runs_its_slice_and_says_limits_are_its_own(shards: list[Path]) -> None:
    seen: set[str] = set()
    for index, folder in enumerate(shards[:SHARDS]):
        names = {p.name for p in RunLayout(folder).tasks.iterdir()}
        assert all(shard_of(name, SHARDS) == index for name in names)  # the sample's folders are its task ids
        assert not names & seen
        seen |= names
        log = (folder.parent / f"{index}.log").read_text()
        assert log.count("rate limits and experiment.budget are per shard") == 1
    assert len(seen) == 10
    # The same on every machine and Python: a hash of the id alone.
    assert [shard_of(f"sample-0{i}", SHARDS) for i in (1, 2, 3, 4)] == [0, 3, 1, 3]


def test_the_merge_equals_one_run_task_by_task(merged: Path, sample_run: Path) -> None:
    one, both = RunLayout(sample_run), RunLayout(merged)
    names = sorted(p.name for p in one.tasks.iterdir())
    assert sorted(p.name for p in both.tasks.iterdir()) == names
    for name in names:
        assert (both.tasks / name / RESULT_FILE).read_bytes() == (one.tasks / name / RESULT_FILE).read_bytes()
    single, joined = _summary(sample_run), _summary(merged)
    for figure in SAME_FIGURES:
        assert getattr(joined, figure) == getattr(single, figure), figure
    assert joined.usage == single.usage and joined.cost_usd == single.cost_usd
    assert joined.stats == single.stats
    assert len(both.ledger.read_text().splitlines()) == len(one.ledger.read_text().splitlines())
    assert "shard" not in (both.config.read_text() + both.overrides.read_text()).replace("shard: null", "")


def test_the_merge_verifies(merged: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify_main([str(merged)]) == 0, capsys.readouterr().out
    assert "verified" in capsys.readouterr().out


def test_shards_of_other_settings_are_refused(
    shards: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    shutil.copytree(shards[1], other)
    fingerprint = json.loads(RunLayout(other).fingerprint.read_text())
    fingerprint["settings"]["repair.name"] = "strict"
    RunLayout(other).fingerprint.write_text(json.dumps(fingerprint))
    assert merge_main([str(shards[0]), str(other), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "repair.name" in err and "'strict'" in err
    assert merge_main([str(shards[0]), str(shards[0]), "-o", str(tmp_path / "out2")]) == 2
    assert "are both shard 0/4" in capsys.readouterr().err


def test_a_shard_out_of_range_is_one_line_exit_2(shards: list[Path]) -> None:
    said = (shards[SHARDS].parent / f"{SHARDS}.log").read_text().strip().splitlines()
    assert said == ["flowllm: error: experiment.shard 4/4 is out of range: I counts from 0, so it must be 0..3"]
    assert not RunLayout(shards[SHARDS]).fingerprint.exists()


def test_shards_with_budgets_merge_into_a_run_whose_budget_is_theirs_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each shard's budget is its own: the merged run's is their sum (none when a shard had none), so the merge
    does not say one shard's cap was overspent by all of them, and it verifies."""
    runs = {
        "capped-0": ("experiment.shard=0/2", "experiment.budget.cost_usd=0.02"),
        "capped-1": ("experiment.shard=1/2", "experiment.budget.cost_usd=0.02"),
        "open-1": ("experiment.shard=1/2",),
    }
    procs = {
        name: start_flowllm("progress=false", *args, f"hydra.run.dir={tmp_path / name}", log=tmp_path / f"{name}.log")
        for name, args in runs.items()
    }
    for name, proc in procs.items():
        assert proc.wait(timeout=600) in (0, 3), (tmp_path / f"{name}.log").read_text()[-2000:]
    for pair, cap in ((("capped-0", "capped-1"), 0.04), (("capped-0", "open-1"), None)):
        out = tmp_path / "+".join(pair)
        done = run_flowllm("merge", *(str(tmp_path / p) for p in pair), "-o", str(out))
        assert done.returncode == 0, done.stderr[-2000:]
        budget = _summary(out).budget
        assert budget is not None and budget.cost_usd == cap
        assert budget.stopped_tasks  # capped-0's stops, still said
        if cap is None:
            assert not budget.ended_run and budget.reason is None
            assert "the budget ended it" not in done.stdout
        else:
            spent = budget.spent["cost_usd"]
            assert budget.reason == f"the run spent ${spent:.4f} of its $0.04 (experiment.budget.cost_usd)"
            if budget.ended_run:  # said on the merge's line too, as the run's console says it
                assert f"; the budget ended it: {budget.reason}" in done.stdout
        assert verify_main([str(out)]) == 0, capsys.readouterr().out
