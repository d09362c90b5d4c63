"""Resumed turns against the evidence: a task a rerun resumed inside (flowllm/run/resume.py) says how many model
calls its saved turns answered (``resumed_turns``); the summary adds them up.

* ``summary.json → resumed_turns, resumed_tasks`` are the sums over the tasks' ``result.json`` (an epochs run's
  task sums its epochs');
* a run's resumed calls are at most the model calls its folder holds a reply for;
* every one of those replies was paid once, by the session that received it: the ledger holds at least as many
  successful attempts of the task (and epoch) as the folder holds replies, the resumed ones included (a replay or
  fork serves saved replies unpaid: not checked there).
"""

from __future__ import annotations

from pathlib import Path

from flowllm.providers.replay import CALL_NODE, REPLAY_PROTOCOL
from flowllm.rundir.layout import OUTPUT_FILE
from flowllm.rundir.results import TaskResult
from flowllm.scoring.judge import JUDGE_SCOPE
from flowllm.verify.evidence import RunEvidence
from flowllm.verify.findings import Audit

__all__ = ["check_resumed"]

SUMMARY = "summary.json"


def _replies(records: Path) -> int:
    """The model calls a task's (or epoch's) folder holds a reply for, in every conversation of its agents (the
    judge's calls, under ``judge/``, are paid in ``judge_usage.jsonl``)."""
    found = records.rglob(f"*_{CALL_NODE}/{OUTPUT_FILE}")
    return sum(1 for path in found if path.relative_to(records).parts[0] != JUDGE_SCOPE)


def _paid(ev: RunEvidence, task_id: str, epoch: int | None) -> int:
    lines = (line.ledger for line in ev.ledger)
    return sum(1 for x in lines if x.type == "attempt" and x.ok and x.task_id == task_id and (x.epoch or None) == epoch)


def _runs(ev: RunEvidence) -> list[tuple[str, TaskResult, int | None]]:
    """Each run of a task that has its own records: the task's, or each epoch's; with its epoch."""
    if ev.epochs <= 1:
        return [(task_id, result, None) for task_id, result in ev.results.items()]
    return [(task_id, r, epoch) for task_id, epochs in ev.epoch_results.items() for epoch, r in epochs.items()]


def check_resumed(ev: RunEvidence, audit: Audit) -> None:
    results = list(ev.results.values())
    audit.check(SUMMARY, "resumed_turns", ev.summary.resumed_turns, sum(r.resumed_turns for r in results))
    audit.check(SUMMARY, "resumed_tasks", ev.summary.resumed_tasks, sum(1 for r in results if r.resumed_turns))
    if ev.epochs > 1:
        for task_id, result in ev.results.items():
            per_epoch = ev.epoch_results.get(task_id, {}).values()
            file = ev.rel(ev.layout.result(task_id))
            audit.check(file, "resumed_turns", result.resumed_turns, sum(r.resumed_turns for r in per_epoch))
    replay = str(ev.cfg.provider.get("protocol")) == REPLAY_PROTOCOL
    for task_id, result, epoch in _runs(ev):
        if not result.resumed_turns:
            continue
        records = ev.layout.records(task_id, epoch)
        file = ev.rel(records / "result.json")
        replies = _replies(records)
        if result.resumed_turns > replies:
            audit.flag(file, "resumed_turns", result.resumed_turns, f"at most {replies}", "the replies it holds")
        else:
            audit.compared += 1
        if replay:
            audit.skip("resumed calls of a replay or fork: saved replies are served unpaid")
            continue
        paid = _paid(ev, task_id, epoch)
        if paid < replies:
            audit.flag(file, "model calls paid", paid, f"at least {replies}", "usage.jsonl: each reply paid once")
        else:
            audit.compared += 1
