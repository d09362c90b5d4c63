"""A run over epochs (``experiment.epochs`` > 1) as the inspector shows it: every epoch's turns can be opened,
searched and compared. Each epoch's turns sit under ``tasks/<id>/epochs/<n>/``; the inspector names that
conversation ``epochs/<n>`` (``--agent epochs/2``), as it names a sub-agent's by its folder. Before, it read
``tasks/<id>/turn_*`` only: an epochs run had no turn to open, ``grep`` found nothing in its turns, and ``diff``
said its first turn existed only in the run without epochs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowllm.inspect import open_run
from flowllm.inspect.cli import main
from flowllm.inspect.diff import diff_runs
from tests.experiment.helpers import start_flowllm

TASKS = ("sample-03-percentage", "sample-09-arithmetic")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("epochs")
    found, procs = {}, []
    for epochs in (1, 2):  # both at once
        found[epochs] = root / f"e{epochs}"
        args = [f"dataset.task_ids=[{','.join(TASKS)}]", f"experiment.epochs={epochs}", "progress=false"]
        log = root / f"e{epochs}.log"
        procs.append((start_flowllm(*args, f"hydra.run.dir={found[epochs]}", log=log), log))
    for proc, log in procs:
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    return found


def test_each_epochs_node_opens_by_its_conversation(runs: dict[int, Path], capsys: pytest.CaptureFixture[str]) -> None:
    run = str(runs[2])
    args = ["node", TASKS[0], "1", "call_model", "--only", "meta", "--json"]
    assert main([run, *args, "--agent", "epochs/2"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert Path(shown["path"]).parts[-4:] == ("epochs", "2", "turn_001", "03_call_model")
    assert shown["meta"]["node"] == "call_model"
    assert main([run, *args]) == 2  # the task has no turns of its own: the error names the epochs to ask for
    assert "it ran 2 epochs: name one with --agent epochs/1 (to epochs/2)" in capsys.readouterr().err


def test_grep_reads_every_epochs_turns(runs: dict[int, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(runs[2]), "grep", "is \\boxed{398.65}", "--json"]) == 0  # the answering turn's text
    hits = json.loads(capsys.readouterr().out)
    assert sorted((h["task_id"], h["agent"], h["turn"]) for h in hits) == [
        (TASKS[0], "epochs/1", 2),
        (TASKS[0], "epochs/2", 2),
    ]


def test_a_run_once_is_compared_with_the_first_epoch_of_a_run_over_epochs(runs: dict[int, Path]) -> None:
    result = diff_runs(open_run(runs[1]), open_run(runs[2]))
    assert result.settings_changes == {"experiment.epochs": (1, 2)}
    assert [t.task_id for t in result.tasks] == list(TASKS)  # twice the turns: each task's figures differ
    for task in result.tasks:
        # Epoch 1 is the same conversation as the run without epochs; epoch 2 has no counterpart there.
        assert task.divergence is not None
        assert (task.divergence.agent, task.divergence.turn) == ("epochs/2", 1)
        assert "exists only in B" in task.divergence.detail
        assert task.call_changes and all("epochs/2" in change for change in task.call_changes)
