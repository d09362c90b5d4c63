"""A run whose history was compacted replays and forks: the summary call (a one-call conversation of its own,
``nested_scope``) is served from the compact_history node's record that holds its exchange. Such a task once
failed as "missing" in every replay ("the replayed run never made this turn"), and its accuracy went unknown."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from flowllm.verify import audit_run
from tests.replay.runs import run_flowllm

pytestmark = pytest.mark.long

TASK = "sample-02-word-count"  # three turns: its third compacts the first
COMPACTING = (
    f"dataset.task_ids=[{TASK}]",
    "agent.compaction.enabled=true",
    "agent.compaction.threshold_tokens=300",
    "agent.compaction.keep_turns=1",
)


def _compactions(run: Path) -> list[dict]:
    found = []
    for output in sorted((run / "tasks" / TASK).glob("turn_*/*_compact_history/output.json")):
        info = orjson.loads(output.read_bytes())["compaction"]
        if info["compacted"]:
            found.append(info)
    return found


def test_a_compacted_run_replays_exactly_and_forks(tmp_path: Path) -> None:
    saved = run_flowllm(tmp_path / "saved", *COMPACTING).check()
    compacted = _compactions(saved.run_dir)
    assert compacted, "the saved run compacted no history: the test proves nothing"

    replayed = run_flowllm(
        tmp_path / "replay", *COMPACTING, "provider=replay", f"provider.run_dir={saved.run_dir}"
    ).check()
    result = replayed.result(TASK)
    assert result["replay"] == {"status": "exact"}
    assert (result["status"], result["correct"], result["turns"]) == ("completed", True, saved.result(TASK)["turns"])
    assert _compactions(replayed.run_dir) == compacted  # the saved summary, served to the same request
    assert audit_run(replayed.run_dir).verified

    forked = run_flowllm(
        tmp_path / "fork",
        *COMPACTING,
        "provider=replay",
        f"provider.run_dir={saved.run_dir}",
        "provider.fork=live",
        "provider.live=offline",
        "repair=strict",
    ).check()
    verdict = forked.result(TASK)["replay"]
    assert verdict["status"] == "exact"  # strict repair changes nothing here: no live call
    assert forked.result(TASK)["correct"] is True
    assert audit_run(forked.run_dir).verified
