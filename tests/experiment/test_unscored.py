"""Unscored is not wrong: a task without ground truth has ``correct: null``, accuracy is over the scored tasks,
and the headline and every breakdown count the same way."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flowllm.core.types import Usage
from flowllm.datasets.task import Task
from flowllm.engine.recorder import read_json
from flowllm.run.outcome import COMPLETED, FAILED, TaskOutcome, read_outcome
from flowllm.run.report import headline_accuracy
from flowllm.run.summary import summarize
from flowllm.scoring import GaiaScorer
from flowllm.scoring.report import breakdown
from tests.experiment.helpers import GAIA, LIST_TASK, MISSING_FILE_TASK, WRONG_TASK, run_flowllm


def _outcome(task_id: str, correct: bool | None, *, level: int = 1, status: str = COMPLETED) -> TaskOutcome:
    return TaskOutcome(
        task_id=task_id,
        status=status,
        answer="x" if status == COMPLETED else None,
        ground_truth=None if correct is None else "x",
        correct=correct,
        turns=1,
        usage=Usage(),
        level=level,
        categories={"topic": "a"},
    )


def test_headline_and_breakdowns_count_the_same_scored_tasks() -> None:
    # An interrupted run: 10 tasks, 5 finished (4 at level 1, all right; 1 at level 2 unscored).
    outcomes = [_outcome(f"t{i}", True) for i in range(4)] + [_outcome("u", None, level=2)]
    summary = summarize(outcomes, total=10, wall_seconds=1.0, interrupted=True).to_dict()
    assert (summary["scored"], summary["unscored"], summary["correct"], summary["accuracy"]) == (4, 1, 4, 1.0)
    assert summary["by_level"]["1"] == {"tasks": 4, "scored": 4, "unscored": 0, "correct": 4, "accuracy": 1.0}
    assert summary["by_level"]["2"]["accuracy"] is None  # not known, never 0
    assert breakdown(outcomes, ["topic"])["topic"]["a"]["accuracy"] == 1.0
    text = headline_accuracy(summary)
    assert text == "100.0% (4/4 scored); 1 unscored: no ground truth; 5 unfinished, not counted"


def test_nothing_scored_is_not_known() -> None:
    summary = summarize([_outcome("u", None)], total=1, wall_seconds=1.0, interrupted=False).to_dict()
    assert summary["accuracy"] is None and summary["scored"] == 0
    assert headline_accuracy(summary).startswith("not known (0 scored)")


def test_a_resume_keeps_null_for_a_task_without_ground_truth(tmp_path: Path) -> None:
    task = Task("t", "q?", 1, None, None, tmp_path)
    path = tmp_path / "result.json"
    for status, answer in ((COMPLETED, "42"), (FAILED, None)):
        saved = _outcome("t", None, status=status).to_dict() | {"answer": answer}
        path.write_text(json.dumps(saved))
        outcome = read_outcome(path, task, GaiaScorer().rules)
        assert outcome is not None and outcome.correct is None, status
    # A result.json claiming a score for a task with no ground truth is not believed.
    path.write_text(json.dumps(_outcome("t", None).to_dict() | {"correct": True}))
    outcome = read_outcome(path, task, GaiaScorer().rules)
    assert outcome is not None and outcome.correct is None


def _dataset(tmp_path: Path, strip: set[str] | None, hidden: dict[str, str] | None = None) -> Path:
    """The fixture dataset with ``Final answer`` removed from the rows in ``strip`` (None: every row), and set to
    ``hidden``'s value (task id -> answer) in those rows."""
    folder = tmp_path / "gaia"
    shutil.copytree(GAIA, folder)
    rows = [json.loads(line) for line in (folder / "metadata.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        if strip is None or row["task_id"] in strip:
            row.pop("Final answer", None)
        if row["task_id"] in (hidden or {}):
            row["Final answer"] = (hidden or {})[row["task_id"]]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _run(data: Path, run_dir: Path, *ids: str, attempts: int = 1) -> tuple[int, str]:
    proc = run_flowllm(
        "+experiment=gaia",
        f"experiment.attempts={attempts}",
        "progress=false",
        "tools=none",
        f"dataset.path={data}",
        f"provider.emulator_script={data / 'script.yaml'}",
        f"hydra.run.dir={run_dir}",
        f"dataset.task_ids=[{','.join(ids)}]",
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_a_test_split_ends_normally_and_a_missing_truth_is_unscored(tmp_path: Path) -> None:
    test_split = _dataset(tmp_path / "split", None)
    mixed = _dataset(tmp_path / "mixed", {WRONG_TASK})
    with ThreadPoolExecutor(2) as pool:
        # pass@3: retry-until-correct has nothing to retry until without a ground truth.
        split_ids = (LIST_TASK, WRONG_TASK, MISSING_FILE_TASK)
        split_run = pool.submit(_run, test_split, tmp_path / "r-split", *split_ids, attempts=3)
        mixed_run = pool.submit(_run, mixed, tmp_path / "r-mixed", LIST_TASK, WRONG_TASK, attempts=3)
        (split_code, split_out), (mixed_code, mixed_out) = split_run.result(), mixed_run.result()
    # Nothing can be scored: answers are saved, accuracy is not known; the exit code is the tasks' (one failed).
    assert split_code == 3, split_out[-3000:]
    summary = read_json(tmp_path / "r-split" / "summary.json")
    assert (summary["scored"], summary["unscored"], summary["accuracy"]) == (0, 3, None)
    assert read_json(tmp_path / "r-split" / "tasks" / LIST_TASK / "result.json")["correct"] is None
    assert read_json(tmp_path / "r-split" / "tasks" / MISSING_FILE_TASK / "result.json")["correct"] is None
    assert read_json(tmp_path / "r-split" / "tasks" / WRONG_TASK / "result.json")["answer"] == "Paris"
    assert "not known (0 scored); 3 unscored: no ground truth" in split_out
    # An answer without a ground truth is not run again (it once ran all k attempts, each paid for); an attempt
    # that gave no answer is.
    tries = {t: read_json(tmp_path / "r-split" / "tasks" / t / "result.json")["attempts"] for t in split_ids}
    assert tries == {LIST_TASK: 1, WRONG_TASK: 1, MISSING_FILE_TASK: 3}
    assert summary["attempts_used"] == 5
    # The wrong task has no ground truth: unscored, not wrong; accuracy is over the one scored task.
    assert mixed_code == 0, mixed_out[-3000:]
    summary = read_json(tmp_path / "r-mixed" / "summary.json")
    assert (summary["scored"], summary["unscored"], summary["correct"], summary["accuracy"]) == (1, 1, 1, 1.0)
    assert summary["by_level"]["3"]["accuracy"] is None
    assert summary["attempts_used"] == 2  # the right answer at once, the unscored one not retried
    assert "100.0% (1/1 scored); 1 unscored: no ground truth" in mixed_out


def test_a_hidden_or_empty_final_answer_is_no_ground_truth(tmp_path: Path) -> None:
    """GAIA's test split hides its answers as ``?``; an empty answer is no ground truth either."""
    data = _dataset(tmp_path, set(), {LIST_TASK: "?", WRONG_TASK: ""})
    code, out = _run(data, tmp_path / "run", LIST_TASK, WRONG_TASK)
    assert code == 0, out[-3000:]
    summary = read_json(tmp_path / "run" / "summary.json")
    assert (summary["scored"], summary["unscored"], summary["accuracy"]) == (0, 2, None)
    for task_id in (LIST_TASK, WRONG_TASK):
        result = read_json(tmp_path / "run" / "tasks" / task_id / "result.json")
        assert (result["ground_truth"], result["correct"]) == (None, None)
    assert "not known (0 scored); 2 unscored: no ground truth" in out


def test_a_replay_runs_the_attempts_its_saved_run_ran(tmp_path: Path) -> None:
    """pass@k stops at an answer without a ground truth; a run made when it did not (or with the truth known then)
    ran more attempts. A replay of it runs those too: it repeats what the saved run did, attempt by attempt (it
    stopped at the first, and answered with another attempt's answer than the saved run's)."""
    saved, replay = tmp_path / "saved", tmp_path / "replay"
    code, out = _run(_dataset(tmp_path / "full", set()), saved, WRONG_TASK, attempts=3)
    assert code == 0, out[-3000:]
    assert read_json(saved / "tasks" / WRONG_TASK / "result.json")["attempts"] == 3  # wrong, retried
    hidden = _dataset(tmp_path / "hidden", {WRONG_TASK})  # the same task with its truth taken away
    proc = run_flowllm(
        "progress=false",
        "provider=replay",
        f"provider.run_dir={saved}",
        f"dataset.path={hidden}",
        f"hydra.run.dir={replay}",
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = read_json(replay / "tasks" / WRONG_TASK / "result.json")
    assert (result["attempts"], result["correct"], result["replay"]["status"]) == (3, None, "exact")
