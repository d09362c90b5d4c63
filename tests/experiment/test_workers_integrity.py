"""Resume under ``experiment.workers=2`` reads ``result.json`` as a one-process resume does: the task's own
(safe) folder, the file checked to be that task's, ``correct`` recomputed from the answer and the dataset.

A forged ``correct: true`` over a wrong answer does not raise the score, for a plain id and for one that
cannot name a folder (``a/b``, a 300-character id: found again in their ``<name>-<hash>`` folders).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from flowllm.rundir.layout import RunLayout
from tests.experiment.helpers import run_flowllm

HANG_GUARD_S = 600  # only against a hang: the suite runs on loaded machines
LONG_ID = "y" * 300
# task id -> (ground truth, the emulated model's answer)
TASKS = {
    "right": ("4", "4"),
    "wrong": ("Lyon", "Paris"),
    "a/b": ("blue", "red"),
    LONG_ID: ("10", "10"),
}
FORGED = ("wrong", "a/b")


def _dataset(folder: Path) -> Path:
    folder.mkdir()
    rows = [{"task_id": t, "Question": "q", "Level": 1, "Final answer": truth} for t, (truth, _) in TASKS.items()]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = {
        "default": [{"text": "\\boxed{none}"}],
        "tasks": {t: [{"text": f"\\boxed{{{answer}}}"}] for t, (_, answer) in TASKS.items()},
    }
    (folder / "script.yaml").write_text(yaml.safe_dump(script))
    return folder


def _run(dataset: Path, run_dir: Path) -> tuple[int, str]:
    proc = run_flowllm(
        "+experiment=gaia",
        "progress=false",
        "tools=none",
        f"dataset.path={dataset}",
        f"provider.emulator_script={dataset / 'script.yaml'}",
        f"hydra.run.dir={run_dir}",
        "experiment.max_concurrent=2",
        "experiment.workers=2",
        timeout=HANG_GUARD_S,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_a_forged_score_does_not_count_on_resume_under_two_workers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    layout = RunLayout(run_dir)
    dataset = _dataset(tmp_path / "data")
    code, output = _run(dataset, run_dir)
    assert code == 0, output
    summary = json.loads(layout.summary.read_text())
    # The parent found every result, the odd ids' in their safe folders too: nothing is left pending.
    assert summary["interrupted"] is False and summary["completed"] == len(TASKS), output
    assert summary["correct"] == 2
    for task_id in TASKS:
        assert json.loads(layout.result(task_id).read_text())["task_id"] == task_id

    for task_id in FORGED:
        path = layout.result(task_id)
        path.write_text(json.dumps({**json.loads(path.read_text()), "correct": True}))
    forged = {t: layout.result(t).read_bytes() for t in TASKS}
    code, output = _run(dataset, run_dir)
    assert code == 0, output
    summary = json.loads(layout.summary.read_text())
    # Every task was kept (found again where it was written), and the forged scores did not count.
    assert summary["resumed"] == summary["completed"] == len(TASKS), output
    assert summary["correct"] == 2, output
    assert output.count("says correct=True; scored against the dataset it is False") == len(FORGED), output
    assert {t: layout.result(t).read_bytes() for t in TASKS} == forged  # nothing ran again
