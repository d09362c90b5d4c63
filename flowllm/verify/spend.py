"""What a run spent, from its ledgers and the price table: every attempt line's cost recomputed (a batch call at
the table's batch factor), the totals the summary states, and the budget's verdict.

Every model call counts, the judge's too: the run's spend is the agent's ledger (``usage.jsonl``) plus the
judge's (``judge_usage.jsonl``). A replay's own ledger holds only the live calls it made (a fork's), so a
replay that made none spent nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flowllm.core.types import Usage
from flowllm.datasets.shards import shard_override
from flowllm.providers.adaptive.aimd import parse_auto
from flowllm.rundir.results import BudgetBlock, LedgerLine
from flowllm.spend.saved_stops import SavedStops
from flowllm.verify.evidence import NumberedLine, RunEvidence, saved_run
from flowllm.verify.findings import TOLERANCE, Audit

__all__ = ["check_spend"]

SUMMARY = "summary.json"
ATTEMPT = "attempt"


def _line_cost(ev: RunEvidence, line: LedgerLine) -> float | None:
    """The cost of one attempt line as the price table gives it (None: the model has no price)."""
    if not line.billed:
        return 0.0
    assert ev.prices is not None
    price = ev.prices.lookup(str(line.model or ""))
    if price is None:
        return None
    factor = 1.0
    if line.batch:
        found = ev.prices.batch_factor(str(line.protocol or ""))
        if found is None:
            return None
        factor = found
    return round(price.cost(Usage.from_dict(line.usage)) * factor, 8)


def _ledger_total(ev: RunEvidence, audit: Audit, name: str, lines: Sequence[NumberedLine]) -> float | None:
    """The sum of a ledger's attempt costs, each line's cost checked first (None: a call has no price)."""
    total = 0.0
    unpriced = False
    for line in lines:
        value = line.ledger
        if value.type != ATTEMPT:
            continue
        recomputed = _line_cost(ev, value)
        if recomputed is None:
            unpriced = True
            continue
        audit.check(name, f"line {line.number}: cost_usd", value.cost_usd, recomputed, "usage x price table")
        total += recomputed
    return None if unpriced else round(total, 6)


def _max_call(lines: Sequence[NumberedLine]) -> float:
    """The most one model call cost: its billed attempts summed (an empty reply, billed, then the retry)."""
    costs: dict[tuple[object, ...], float] = {}
    for numbered in lines:
        line = numbered.ledger
        if line.type == ATTEMPT:
            key = (line.call, line.task_id, line.agent, line.turn, line.epoch)
            costs[key] = costs.get(key, 0.0) + float(line.cost_usd or 0.0)
    return max(costs.values(), default=0.0)


def _shards(ev: RunEvidence) -> int:
    """How many shards spent apart (a merged run's sessions name theirs: ``experiment.shard=I/N``); 1 otherwise.
    Each could pass its own cap by its own calls in flight."""
    named = {shard_override(o) for session in ev.history for o in session.get("overrides") or []}
    return max(1, len(named - {None}))


def _session_in_flight(ev: RunEvidence, session: Mapping[str, Any]) -> int | None:
    """The calls one session could have in flight: its tasks at once times its worker processes, as its history
    line records them; for a line written before they were, its overrides over the saved config. None when that
    is not known (``experiment.workers=auto``, not recorded: the cores of the machine it ran on)."""
    recorded = session.get("concurrency")
    if isinstance(recorded, Mapping):
        tasks, workers = recorded.get("tasks"), recorded.get("workers")
        if isinstance(tasks, int) and isinstance(workers, int):
            return max(1, tasks) * max(1, workers)
    given = dict(str(o).lstrip("+~").partition("=")[::2] for o in session.get("overrides") or [])
    concurrent = str(given.get("experiment.max_concurrent", ev.cfg.experiment.get("max_concurrent") or 1))
    workers = str(given.get("experiment.workers", ev.cfg.experiment.get("workers") or 1))
    try:
        return (parse_auto(concurrent) or int(concurrent)) * max(1, int(workers))  # auto:N runs up to N tasks
    except ValueError:
        return None


def _raised_by_ctl(line: Mapping[str, Any]) -> int | None:
    """The tasks at once a ``flowllm ctl RUN set experiment.max_concurrent=N`` line of the history set (the whole
    run's, its workers' together); None for any other line."""
    args = line.get("args") or []
    if line.get("control") != "set" or not line.get("ok") or len(args) != 1:
        return None
    key, _, value = str(args[0]).partition("=")
    return int(value) if key.strip() == "experiment.max_concurrent" and value.strip().isdigit() else None


def _in_flight(ev: RunEvidence) -> int | None:
    """The most calls the run could have had in flight past its cap: its busiest session's (or what ``flowllm
    ctl`` raised it to), once per shard (a merged run's shards spent apart); None when a session's is not known."""
    sessions = [line for line in ev.history if "control" not in line] or [{}]
    counts = [_session_in_flight(ev, session) for session in sessions]
    if any(n is None for n in counts):
        return None
    counts += [n for n in map(_raised_by_ctl, ev.history) if n is not None]
    return max(n for n in counts if n is not None) * _shards(ev)


def _replayed(ev: RunEvidence) -> tuple[bool, Path | None]:
    """Whether the run is a plain replay (not a fork), and the saved run it served (None: not at hand)."""
    provider = ev.cfg.get("provider") or {}
    if provider.get("protocol") != "replay" or provider.get("fork") is not None:
        return False, None
    return True, saved_run(ev, str(provider.get("run_dir") or ""))


def _check_budget(ev: RunEvidence, audit: Audit, spent: float | None) -> None:
    budget = ev.summary.budget
    if not isinstance(budget, BudgetBlock):
        return
    audit.check(SUMMARY, "budget.spent.cost_usd", budget.spent.get("cost_usd"), spent, "the ledgers")
    cap = budget.cost_usd
    if cap is None or spent is None:
        return
    unfinished = len(ev.tasks) - sum(1 for r in ev.results.values() if r.status != "budget")
    # Under experiment.coordination the cap is every process's together: the summary records what they had spent
    # (Redis holds it, not this folder), which holds at least this folder's own spend.
    shared = (budget.shared_spent or {}).get("cost_usd")
    if shared is not None and shared + TOLERANCE < spent:
        audit.flag(SUMMARY, "budget.shared_spent.cost_usd", shared, f"at least {spent}", "this folder's ledgers")
    unread = (budget.shared_spent or {}).get("error")
    replay, saved = _replayed(ev)
    if unread:  # the run saw the shared spend; this folder cannot show it
        audit.skip(f"budget.ended_run: the spend shared under experiment.coordination is not known ({unread})")
    elif replay:  # a replay bills nothing: it stops where its saved run's budget stopped that run
        if saved is not None:
            ended = SavedStops(saved).ended_run and unfinished > 0
            audit.check(SUMMARY, "budget.ended_run", budget.ended_run, ended, "the replayed run's summary")
        else:
            audit.skip("budget.ended_run of a replay: the replayed run is not at hand")
    else:
        basis, said = (spent, "spent vs the cap") if shared is None else (shared, "the shared spend vs the cap")
        reached = basis >= float(cap)
        audit.check(SUMMARY, "budget.ended_run", budget.ended_run, reached and unfinished > 0, said)
    # A budget stops new turns; the turns in flight finish: at most one call per running task past the cap.
    in_flight = _in_flight(ev)
    if in_flight is None:
        audit.skip("the budget's bound: how many workers experiment.workers=auto started was not recorded")
        return
    bound = round(float(cap) + in_flight * _max_call([*ev.ledger, *ev.judge_ledger]), 6)
    if spent > bound:
        audit.flag(SUMMARY, "budget.spent.cost_usd", spent, f"at most {bound}", "the cap plus the turns in flight")
    else:
        audit.compared += 1


def check_spend(ev: RunEvidence, audit: Audit) -> None:
    """Every ledger line's cost, the totals and the budget's verdict."""
    if ev.prices is None:
        audit.skip(f"costs: the price table {ev.price_table_path} cannot be read")
        return
    agent = _ledger_total(ev, audit, "usage.jsonl", ev.ledger)
    judge = _ledger_total(ev, audit, "judge_usage.jsonl", ev.judge_ledger)
    providers = ev.summary.providers
    if providers and agent is not None:
        audit.check(SUMMARY, "providers.cost_usd", providers.get("cost_usd"), agent, "usage.jsonl")
    spent = None if agent is None or judge is None else round(agent + judge, 6)
    if spent is None:
        audit.skip("cost totals: a call's model has no price in the table")
    else:
        audit.check(SUMMARY, "cost_usd", ev.summary.cost_usd, spent, "every call of the run's ledgers")
    _check_budget(ev, audit, spent)
