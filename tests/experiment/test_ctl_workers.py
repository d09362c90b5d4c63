"""``flowllm ctl`` applies to every worker of a run (``experiment.workers=2``, local processes or Ray tasks): pause
stops new turns in both, ``set experiment.max_concurrent`` changes the calls in flight the emulator sees,
``requeue`` runs a failed task again. Nothing waits a fixed time: each step waits for what the run or the emulator
says."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from flowllm.emulator import Emulator
from flowllm.emulator.faults import FaultPlan
from tests.experiment.helpers import start_flowllm
from tests.experiment.test_ctl import (
    FAILS_FIRST,
    SCRIPT,
    Steered,
    args,
    ctl,
    pause_set_resume,
    result_status,
    wait_until,
)
from tests.experiment.test_ray_executor import needs_ray

pytestmark = pytest.mark.long


def faults() -> FaultPlan:
    """The first call of FAILS_FIRST is refused (400); every call takes 0.5 s, so the calls of four tasks at once
    overlap in the emulator."""
    refused = {"fault": "status", "status": 400, "tasks": [FAILS_FIRST], "attempts": [1], "turns": [1]}
    return FaultPlan.parse({"rules": [refused, {"fault": "delay", "delay_s": 0.5}]})


@pytest.fixture(scope="module", params=["local", pytest.param("ray", marks=needs_ray)])
def steered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Steered]:
    """Eight tasks on two workers (local processes, or Ray tasks on a local Ray instance), one task at a time each:
    the first fails and is requeued; the run is paused until every running task waits, its max_concurrent set to
    4, resumed, and left to finish."""
    tmp = tmp_path_factory.mktemp("ctl-workers")
    run_dir, log = tmp / "run", tmp / "log.txt"
    extra = ("dataset.limit=8", "experiment.workers=2", "experiment.max_concurrent=2")
    extra += (f"experiment.executor={request.param}",)
    with Emulator(SCRIPT, faults=faults()) as emu:
        proc = start_flowllm(*args(run_dir, emu, *extra), log=log)
        try:
            seen = Steered(0, run_dir)
            wait_until("the first task failed", lambda: result_status(run_dir, FAILS_FIRST) == "failed", proc, log)
            seen.answers["requeue"] = ctl(run_dir, "requeue", FAILS_FIRST)
            pause_set_resume(seen, emu, proc, log, concurrent=4, peak=3)
        finally:
            if proc.poll() is None:
                proc.kill()
    yield seen


def test_pause_stops_new_turns_in_both_workers(steered: Steered) -> None:
    code, answer = steered.answers["pause"]
    assert code == 0 and answer["message"].startswith("paused")
    assert "not yet applied" not in answer["message"], "answered once both workers applied it"
    # Two tasks ran at once (one per worker): at most their one turn each already past the gate went after it.
    assert steered.sent_when_all_waited - steered.sent_at_pause <= 2
    paused = steered.answers["paused status"][1]
    assert paused["workers"] == 2 and paused["state"]["paused"] is True
    assert paused["waiting_at_turn"] == paused["running"] > 0
    assert steered.code == 0, "resumed, every task completed (the requeued one too)"


def test_set_max_concurrent_reaches_the_workers(steered: Steered) -> None:
    assert steered.answers["set"][0] == 0
    assert steered.peak_before_set <= 2 and steered.peak_after_set >= 3, "one worker alone could send only 2"


def test_requeue_in_a_worker_runs_the_failed_task_again(steered: Steered) -> None:
    assert steered.answers["requeue"][0] == 0
    assert result_status(steered.run_dir, FAILS_FIRST) == "completed"
    summary = json.loads((steered.run_dir / "summary.json").read_text())
    assert summary["completed"] == 8 and summary["failed"] == 0
    lines = [json.loads(x) for x in (steered.run_dir / "history.jsonl").read_text().splitlines()]
    assert [x["ok"] for x in lines if x.get("control") == "requeue"] == [True], "answered once, and logged"
