"""Replays and forks across compaction, the hook researchers switch on and off between runs.

A run whose history was compacted replays and forks: the summary call (a one-call conversation of its own,
``nested_scope``) is served from the compact_history node's record that holds its exchange. Such a task once
failed as "missing" in every replay ("the replayed run never made this turn"), and its accuracy went unknown.

A hook switched on (or off) for the replay adds (or removes) a node before the others, so every node after it
is numbered differently from the saved run's: the audit finds each node's record by its name, and a node the
saved run did not have is where the task diverged. Such tasks were once "unverified" (unscored) even in a fork,
where every request they made was the saved run's.

The prompt cache's bound counts the summary calls, as the ledger bills them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from flowllm.providers.ledger import UsageLedger
from flowllm.spend.run_cache import run_cache
from flowllm.verify import audit_run
from tests.replay.runs import Finished, run_flowllm

pytestmark = pytest.mark.long

SHORT = "sample-01-csv-revenue"  # two turns: too few to compact
LONG = "sample-02-word-count"  # three turns: its third compacts the first
TASKS = f"dataset.task_ids=[{SHORT},{LONG}]"
COMPACTING = (
    "agent.compaction.enabled=true",
    "agent.compaction.threshold_tokens=300",
    "agent.compaction.keep_turns=1",
)
FORK = ("provider.fork=live", "provider.live=offline")


@dataclass
class Saved:
    compacted: Finished  # compaction on: LONG compacted at turn 3
    plain: Finished  # compaction off


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    tmp = tmp_path_factory.mktemp("compaction")
    return Saved(
        run_flowllm(tmp / "compacted", TASKS, *COMPACTING).check(),
        run_flowllm(tmp / "plain", TASKS).check(),
    )


def _compactions(run: Path, task: str) -> list[dict]:
    found = []
    for output in sorted((run / "tasks" / task).glob("turn_*/*_compact_history/output.json")):
        info = orjson.loads(output.read_bytes())["compaction"]
        if info["compacted"]:
            found.append(info)
    return found


def _replay(tmp_path: Path, name: str, saved: Finished, *overrides: str) -> Finished:
    run = run_flowllm(tmp_path / name, TASKS, "provider=replay", f"provider.run_dir={saved.run_dir}", *overrides)
    assert audit_run(run.run_dir).verified
    return run


def test_a_compacted_run_replays_exactly_and_forks(saved: Saved, tmp_path: Path) -> None:
    compacted = _compactions(saved.compacted.run_dir, LONG)
    assert compacted, "the saved run compacted no history: the test proves nothing"
    replayed = _replay(tmp_path, "replay", saved.compacted, *COMPACTING).check()
    for task in (SHORT, LONG):
        result = replayed.result(task)
        assert result["replay"] == {"status": "exact"}
        assert (result["correct"], result["turns"]) == (True, saved.compacted.result(task)["turns"])
    assert _compactions(replayed.run_dir, LONG) == compacted  # the saved summary, served to the same request

    forked = _replay(tmp_path, "fork", saved.compacted, *COMPACTING, *FORK, "repair=strict").check()
    assert forked.result(LONG)["replay"]["status"] == "exact"  # strict repair changes none of its calls
    short = forked.result(SHORT)["replay"]  # it refuses SHORT's first call, so its next request differs
    assert (short["status"], short["turn"], short["divergence"]["node"]) == ("forked", 2, "repair_arguments")


def test_a_fork_that_switches_compaction_on_scores_every_task(saved: Saved, tmp_path: Path) -> None:
    forked = _replay(tmp_path, "fork", saved.plain, *COMPACTING, *FORK).check()
    short = forked.result(SHORT)
    # It never compacted, and every request it made was the saved run's: the saved replies answered it.
    assert short["replay"]["status"] == "forked"
    assert (short["replay"]["turn"], short["replay"]["live_calls"]) == (None, 0)
    assert short["replay"]["divergence"] == {
        "turn": 1,
        "node": "compact_history",
        "what": "the saved run has no compact_history node",
    }
    assert short["correct"] is True
    long = forked.result(LONG)  # its summary call was never made: it went live there
    assert (long["replay"]["status"], long["replay"]["scope"], long["correct"]) == (
        "forked",
        "turn_003/compactor",
        True,
    )
    assert _compactions(forked.run_dir, LONG)
    assert orjson.loads((forked.run_dir / "summary.json").read_bytes())["replay"]["unscored"] == 0


def test_a_plain_replay_finds_nodes_by_name_across_an_added_or_removed_hook(saved: Saved, tmp_path: Path) -> None:
    on = _replay(tmp_path, "on", saved.plain, *COMPACTING).check(3)  # LONG's summary call has no saved reply
    assert on.result(LONG)["replay"] == {"status": "missing"}
    assert on.result(SHORT)["replay"] == {
        "status": "diverged",
        "turn": 1,
        "node": "compact_history",
        "what": "the saved run has no compact_history node",
    }
    # A replay repeats the saved run's agent settings, compaction's too, unless told otherwise.
    off = _replay(tmp_path, "off", saved.compacted, "agent.compaction.enabled=false").check()
    assert off.result(SHORT)["replay"] == {"status": "exact"}  # every node it ran recorded the same output
    long = off.result(LONG)["replay"]  # its third request holds the whole history, not the summary
    assert (long["status"], long["turn"], long["node"]) == ("diverged", 3, "trim_history")


def test_the_cache_bound_counts_the_summary_calls(saved: Saved) -> None:
    """The bound of the prompt cache is over every prompt the run sent, as the ledger bills every call: compaction's
    summary calls were left out, so a compacted task was billed 1.2x its bound where it was at the bound."""
    cache = run_cache(saved.compacted.run_dir)
    lines = UsageLedger.read(saved.compacted.run_dir / "usage.jsonl").attempt_lines()
    for task in (SHORT, LONG):
        assert cache.tasks[task].prompts == sum(1 for line in lines if line.task_id == task and line.billed)
    assert cache.tasks[LONG].prompts == saved.compacted.result(LONG)["turns"] + 1


def test_a_rerun_resumes_a_compacted_task_paying_nothing_again(saved: Saved, tmp_path: Path) -> None:
    """A task killed after its history was compacted resumes from its saved turns. The summary call had no saved
    reply where the resume looked (a call node of its own scope), so the task went live there and paid that call
    and every later turn again."""
    run = tmp_path / "run"
    shutil.copytree(saved.compacted.run_dir, run)
    (run / "tasks" / LONG / "result.json").unlink()  # as a crash after its last turn leaves it
    ledger = run / "usage.jsonl"
    paid = ledger.read_bytes()
    rerun = run_flowllm(run, TASKS, *COMPACTING).check()
    result = rerun.result(LONG)
    assert (result["correct"], result["resumed_turns"]) == (True, saved.compacted.result(LONG)["turns"] + 1)
    assert result.get("resume_divergence") is None
    assert ledger.read_bytes() == paid  # nothing billed again
    assert _compactions(run, LONG) == _compactions(saved.compacted.run_dir, LONG)
