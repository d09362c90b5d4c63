"""Verdicts the run gave about its own tasks, against the evidence: a per-task limit's (``agent.limits``) and a
fork's accounting (``summary.json → fork``: what the live calls cost, what a full live re-run cost in the saved
run's ledger).

Only what the files can prove is checked: the turn limit (counted turns), the token and cost limits of a task
ended by them (its ledger lines reach the cap); wall-clock limits are not recomputable from a folder and are
said so.
"""

from __future__ import annotations

from typing import Any

from flowllm.run.outcome import COMPLETED, LIMIT, TaskOutcome
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import ForkBlock, TaskResult
from flowllm.spend.task_usage import TaskBill, bills_by_task
from flowllm.verify.evidence import RunEvidence, VerifyInputError, read_jsonl, saved_run
from flowllm.verify.findings import Audit

__all__ = ["check_fork", "check_limits"]

SUMMARY = "summary.json"
CLOCK_LIMITS = ("wall_s", "working_s")


def _limits(ev: RunEvidence) -> dict[str, Any]:
    node = ev.cfg.agent.get("limits") if "agent" in ev.cfg else None
    return {str(k): v for k, v in (node or {}).items() if v is not None and k != "score_partial"}


def _one_run_limit(audit: Audit, file: str, result: TaskResult, caps: dict[str, Any], bill: TaskBill | None) -> None:
    status, turns = result.status, int(result.turns or 0)
    cap = caps.get("turns")
    if cap is not None and status == COMPLETED and turns > cap:
        audit.flag(file, "turns", turns, f"at most {cap}", "agent.limits.turns: a limit the task ran past")
    if status != LIMIT:
        return
    limit = str(result.limit)
    if limit == "turns" and cap is not None:
        audit.check(file, "turns", turns, int(cap), "a task ended by agent.limits.turns made that many turns")
    elif limit in ("tokens", "cost_usd") and bill is not None and result.attempts == 1:
        spent = bill.total_tokens if limit == "tokens" else bill.cost_usd
        if spent is not None and spent < float(caps[limit]):
            audit.flag(file, "limit", limit, f"not reached: {spent} < {caps[limit]}", "the task's ledger lines")
    elif limit in CLOCK_LIMITS:
        audit.skip(f"the {limit} limit's verdicts (wall-clock time is not recorded as evidence)")


def check_limits(ev: RunEvidence, audit: Audit) -> None:
    """A task ended by a limit reached it; a completed task did not run past the turn limit."""
    caps = _limits(ev)
    if not caps:
        return
    bills = bills_by_task(line.ledger for line in ev.ledger)
    for task_id, result in ev.results.items():
        per_epoch = ev.epoch_results.get(task_id)
        if per_epoch:
            for epoch, saved in per_epoch.items():
                file = ev.rel(ev.layout.records(task_id, epoch) / "result.json")
                _one_run_limit(audit, file, saved, caps, None)
        else:
            file = ev.rel(ev.layout.result(task_id))
            _one_run_limit(audit, file, result, caps, bills.get(task_id))


def _totals(bills: dict[str, TaskBill], task_ids: list[str]) -> tuple[int, float | None]:
    calls, cost = 0, 0.0
    unpriced = False
    for task_id in task_ids:
        bill = bills.get(task_id)
        if bill is None:
            continue
        calls += bill.calls
        if bill.cost_usd is None:
            unpriced = True
        else:
            cost += bill.cost_usd
    return calls, None if unpriced else round(cost, 6)


def check_fork(ev: RunEvidence, outcomes: list[TaskOutcome], audit: Audit) -> None:
    """A fork's live spending is its own ledger's; its full re-run's is the saved run's ledger (when at hand)."""
    fork = ev.summary.fork
    if not isinstance(fork, ForkBlock):
        return
    task_ids = [o.task_id for o in outcomes]
    live_calls, live_cost = _totals(bills_by_task(line.ledger for line in ev.ledger), task_ids)
    audit.check(SUMMARY, "fork.live_calls", fork.live_calls, live_calls, "usage.jsonl")
    audit.check(SUMMARY, "fork.live_cost_usd", fork.live_cost_usd, live_cost, "usage.jsonl")
    if all(o.attempts == 1 and o.epochs == 1 for o in outcomes):  # else a verdict is its last attempt's or epoch's
        per_task = sum(int((o.replay or {}).get("live_calls") or 0) for o in outcomes)
        audit.check(SUMMARY, "fork.live_calls", fork.live_calls, per_task, "the tasks' replay verdicts")
    saved = saved_run(ev, str(fork.saved_run or ""))
    if saved is None:
        audit.skip(f"the fork's full re-run cost: the saved run {fork.saved_run} is not at hand")
        return
    try:
        lines = read_jsonl(RunLayout(saved).ledger, saved)
    except VerifyInputError as exc:
        audit.skip(f"the fork's full re-run cost: {exc}")
        return
    full_calls, full_cost = _totals(bills_by_task(line.ledger for line in lines), task_ids)
    audit.check(SUMMARY, "fork.full_rerun_calls", fork.full_rerun_calls, full_calls, "the saved run's ledger")
    audit.check(SUMMARY, "fork.full_rerun_cost_usd", fork.full_rerun_cost_usd, full_cost, "the saved run's ledger")
