"""A run over epochs (``experiment.epochs`` > 1) or attempts (``experiment.attempts`` > 1) as the inspector shows
it: every epoch's and every attempt's turns can be opened, searched and compared. Each epoch's turns sit under
``tasks/<id>/epochs/<n>/``, an earlier attempt's under ``attempts/<n>/``; the inspector names those conversations
``epochs/<n>`` and ``attempts/<n>`` (``--agent epochs/2``), as it names a sub-agent's by its folder. Before, it
read ``tasks/<id>/turn_*`` only: an epochs run had no turn to open, ``grep`` found nothing in its turns, ``diff``
said its first turn existed only in the run without epochs, and an earlier attempt could not be seen at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowllm.inspect import open_run
from flowllm.inspect.cli import main
from flowllm.inspect.diff import diff_runs
from tests.experiment.helpers import run_flowllm, start_flowllm

TASKS = ("sample-03-percentage", "sample-09-arithmetic")
RETRIED = "sample-01-csv-revenue"  # its tool call needs the lenient repair stage: under repair=strict it fails


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("epochs")
    tasks = f"dataset.task_ids=[{','.join(TASKS)}]"
    plans = {
        "once": [tasks],
        "twice": [tasks, "experiment.epochs=2"],
        "retried": [f"dataset.task_ids=[{RETRIED}]", "repair=strict", "experiment.attempts=2"],
        "lenient": [f"dataset.task_ids=[{RETRIED}]", "experiment.epochs=2"],  # its repair succeeds
    }
    found, procs = {}, []
    for name, args in plans.items():  # all at once
        found[name], log = root / name, root / f"{name}.log"
        procs.append((start_flowllm(*args, "progress=false", f"hydra.run.dir={found[name]}", log=log), log))
    for proc, log in procs:
        assert proc.wait(timeout=900) in (0, 3), log.read_text()[-3000:]  # the retried task fails twice: 3
    return found


def test_each_epochs_node_opens_by_its_conversation(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    run = str(runs["twice"])
    args = ["node", TASKS[0], "1", "call_model", "--only", "meta", "--json"]
    assert main([run, *args, "--agent", "epochs/2"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert Path(shown["path"]).parts[-4:] == ("epochs", "2", "turn_001", "03_call_model")
    assert shown["meta"]["node"] == "call_model"
    assert main([run, *args]) == 2  # the task has no turns of its own: the error names the epochs to ask for
    assert "it ran 2 epochs: name one with --agent epochs/1 (to epochs/2)" in capsys.readouterr().err


def test_grep_reads_every_epochs_turns(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(runs["twice"]), "grep", "is \\boxed{398.65}", "--json"]) == 0  # the answering turn's text
    hits = json.loads(capsys.readouterr().out)
    assert sorted((h["task_id"], h["agent"], h["turn"]) for h in hits) == [
        (TASKS[0], "epochs/1", 2),
        (TASKS[0], "epochs/2", 2),
    ]


def test_a_run_once_is_compared_with_the_first_epoch_of_a_run_over_epochs(runs: dict[str, Path]) -> None:
    result = diff_runs(open_run(runs["once"]), open_run(runs["twice"]))
    assert result.settings_changes == {"experiment.epochs": (1, 2)}
    assert [t.task_id for t in result.tasks] == list(TASKS)  # twice the turns: each task's figures differ
    for task in result.tasks:
        # Epoch 1 is the same conversation as the run without epochs; epoch 2 has no counterpart there.
        assert task.divergence is not None
        assert (task.divergence.agent, task.divergence.turn) == ("epochs/2", 1)
        assert "exists only in B" in task.divergence.detail
        assert task.call_changes and all("epochs/2" in change for change in task.call_changes)


def test_an_earlier_attempts_turns_are_shown_beside_the_last(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(runs["retried"])
    assert main([run, "failures", "--json"]) == 0
    where = {(f["agent"], f["turn"]) for f in json.loads(capsys.readouterr().out) if f["kind"] == "repair_failed"}
    assert where == {("main", 1), ("attempts/1", 1)}  # the repair failed in both attempts
    args = [run, "node", RETRIED, "1", "repair_arguments", "--agent", "attempts/1", "--only", "meta", "--json"]
    assert main(args) == 0
    assert Path(json.loads(capsys.readouterr().out)["path"]).parts[-4:-1] == ("attempts", "1", "turn_001")


def test_a_replays_divergence_names_the_epoch_it_happened_in(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay under repair=strict parts from the saved run at the repair in each epoch: the task's verdict is
    the first epoch's, and the inspector opens that epoch's node with the saved and the new value."""
    replay = tmp_path / "replay"
    args = ["progress=false", "provider=replay", f"provider.run_dir={runs['lenient']}", "repair=strict"]
    done = run_flowllm(*args, f"hydra.run.dir={replay}")
    assert done.returncode == 0, done.stderr[-2000:]
    verdict = json.loads((replay / "tasks" / RETRIED / "result.json").read_text())["replay"]
    assert (verdict["status"], verdict["turn"], verdict["epoch"]) == ("diverged", 1, 1)
    assert main([str(replay), "task", RETRIED, "--json"]) == 0
    detail = json.loads(capsys.readouterr().out)["replay"]
    assert (detail["agent"], detail["folder"], detail["note"]) == ("epochs/1", "06_repair_arguments", None)
    assert detail["saved"] is not None and detail["new"] is None  # strict repair gave no arguments
