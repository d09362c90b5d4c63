"""Replay end to end: ``python -m flowllm provider=replay provider.run_dir=...`` against a real saved run."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowllm.engine.recorder import read_json
from tests.replay.runs import CLEAN_TASK, LENIENT_TASK, RUNNERS, TASKS, FixtureRuns

# Fields of result.json that may differ between two runs of the same conversation, and the replay's verdict.
TIMING = {"wall_seconds", "replay"}


def _verdict(run_dir: Path, task_id: str) -> dict:
    return read_json(run_dir / "tasks" / task_id / "result.json")["replay"]


def _result(run_dir: Path, task_id: str) -> dict:
    return {k: v for k, v in read_json(run_dir / "tasks" / task_id / "result.json").items() if k not in TIMING}


def _artifacts(run_dir: Path) -> dict[str, bytes]:
    """Every node's input.json and output.json, by path relative to the run (meta.json holds timings)."""
    tasks = run_dir / "tasks"
    return {
        str(p.relative_to(tasks)): p.read_bytes()
        for p in sorted(tasks.rglob("*.json"))
        if p.name in ("input.json", "output.json")
    }


def test_the_original_run_scores_both_tasks(runs: FixtureRuns) -> None:
    for task in TASKS:
        assert runs.original.result(task)["correct"] is True
    assert runs.original.result(LENIENT_TASK)["repairs"] == {"lenient": 1}


@pytest.mark.parametrize("runner", RUNNERS)
def test_replay_reproduces_the_original_run_exactly(runs: FixtureRuns, runner: str) -> None:
    replay = runs.replays[runner].check()
    for task in TASKS:
        assert _result(replay.run_dir, task) == _result(runs.original.run_dir, task)
    # Not just the scores: every node saw and produced the same thing, the raw exchange included.
    original, replayed = _artifacts(runs.original.run_dir), _artifacts(replay.run_dir)
    assert replayed.keys() == original.keys()
    changed = [name for name in original if original[name] != replayed[name]]
    assert changed == []
    summary = read_json(replay.run_dir / "summary.json")
    assert summary["runner"] == runner
    assert summary["provider"] == "replay"
    assert summary["correct"] == 2 and summary["failed"] == 0
    assert "request differs" not in replay.app_log
    # Every node matched the saved run: each task is an exact replay, and the score counts.
    assert [_verdict(replay.run_dir, task) for task in TASKS] == [{"status": "exact"}] * 2
    assert summary["replay"]["exact"] == 2 and summary["replay"]["diverged"] == 0
    assert summary["accuracy"] == 1.0
    # The tokens are the saved run's, served again: the replay billed nothing, and names the saved run's cost apart.
    original_cost = read_json(runs.original.run_dir / "summary.json")["cost"]
    assert summary["cost"]["replayed"] is True and summary["cost_usd"] == summary["cost"]["total_usd"] == 0.0
    assert summary["cost"]["saved_run_usd"] == pytest.approx(original_cost["total_usd"], abs=1e-5)  # its tokens, priced
    assert summary["cost"]["model"] == original_cost["model"]
    assert "$0.0000 billed in this run folder" in replay.stdout and "the saved run paid $" in replay.stdout


def test_replay_with_strict_repair_changes_exactly_the_affected_task(runs: FixtureRuns) -> None:
    strict = runs.strict.check()
    # The clean call is read by the strict stage under both configs: nothing changes for that task.
    assert _result(strict.run_dir, CLEAN_TASK) == _result(runs.original.run_dir, CLEAN_TASK)
    before, after = _result(runs.original.run_dir, LENIENT_TASK), _result(strict.run_dir, LENIENT_TASK)
    changed = {k for k in before if before[k] != after[k]}
    # The saved reply of turn 2 answered a conversation that never happened: the task's score is not known.
    assert changed == {"repairs", "failed_tool_calls", "correct"}
    assert before["correct"] is True and after["correct"] is None
    assert after["repairs"] == {"failed": 1}
    assert after["failed_tool_calls"] == 1
    prepared = read_json(strict.run_dir / "tasks" / LENIENT_TASK / "turn_001" / "06_repair_arguments" / "output.json")
    assert prepared["prepared_calls"][0]["arguments"] is None
    # The model never saw the failure in the old run: the log says the served reply was for another conversation.
    assert f"replay: task {LENIENT_TASK} turn 2: the request differs from the saved one" in strict.app_log
    assert f"task {CLEAN_TASK} turn" not in strict.app_log
    summary = read_json(strict.run_dir / "summary.json")
    assert summary["repair"] == "strict"
    # The saved replies after turn 1 answer a conversation that no longer exists: the task is marked as
    # diverged where it happened, and the score counts exact replays only.
    verdict = _verdict(strict.run_dir, LENIENT_TASK)
    assert (verdict["status"], verdict["turn"], verdict["node"]) == ("diverged", 1, "repair_arguments")
    assert "prepared_calls" in verdict["what"]
    assert _verdict(strict.run_dir, CLEAN_TASK) == {"status": "exact"}
    assert (summary["replay"]["exact"], summary["replay"]["diverged"]) == (1, 1)
    assert summary["accuracy"] == 1.0 and summary["replay"]["accuracy_exact"] == 1.0
    # Both answers still match, but only one task is scored: no figure counts the diverged one either way.
    assert (summary["replay"]["scored"], summary["replay"]["unscored"], summary["correct"]) == (1, 1, 1)
    assert "accuracy_all" not in summary


def test_a_replay_that_rescores_a_change_headlines_that_its_effect_on_the_diverged_task_is_not_known(
    runs: FixtureRuns,
) -> None:
    """The manual's re-score offline (docs/guides/replay-fork.md): 100% on the exact replay must not read as the
    change's effect; the headline says it is not known for the diverged task, and how to learn it (a fork)."""
    strict = runs.strict.check()
    note = "the change's effect on 1 of 2 tasks is not known (they did not replay exactly): rerun with "
    summary = read_json(strict.run_dir / "summary.json")
    assert summary["replay"]["effect_not_known"].startswith(note)
    assert note in summary["accuracy_of"] and "provider.fork=live" in summary["accuracy_of"]
    flat = " ".join(strict.stdout.replace("│", " ").split())
    assert f"accuracy 100.0% (1/1 scored: exact replays); {note}provider.fork=live" in flat
    exact = read_json(runs.replays["graph"].check().run_dir / "summary.json")
    assert exact["replay"]["effect_not_known"] is None and "provider.fork" not in exact["accuracy_of"]


def test_a_turn_the_old_run_never_made_fails_that_task_and_no_other(runs: FixtureRuns) -> None:
    missing = runs.missing_turn.check(3)  # one task failed, the other completed
    failed = missing.result(LENIENT_TASK)
    assert failed["status"] == "failed"
    assert f"task '{LENIENT_TASK}' turn 2" in failed["error"]
    assert "never made this turn" in failed["error"]
    other = missing.result(CLEAN_TASK)
    assert other["status"] == "completed"
    assert other["answer"] == runs.original.result(CLEAN_TASK)["answer"]
    summary = read_json(missing.run_dir / "summary.json")
    assert (summary["completed"], summary["failed"]) == (1, 1)
    assert _verdict(missing.run_dir, LENIENT_TASK) == {"status": "missing"}
    assert failed["correct"] is None  # the replay has no answer for it: unscored, not wrong
    assert summary["replay"]["missing"] == 1


def test_replay_without_a_run_dir_is_one_clear_line(runs: FixtureRuns) -> None:
    finished = runs.no_run_dir
    assert finished.returncode == 2
    assert "provider=replay needs the run to replay: add provider.run_dir=" in finished.stderr
    assert "Traceback" not in finished.stderr
