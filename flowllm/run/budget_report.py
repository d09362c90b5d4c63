"""What the caps did to a run: the ``budget`` block of ``summary.json`` and its lines on the console.

Built from the run's ledger (the spend of every process and session) and the tasks' results, so the parent of
several workers writes the same block as a one-process run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowllm.core.coordination import Coordination, RedisSpend
from flowllm.providers.ledger import UsageLedger
from flowllm.run.outcome import BUDGET, TaskOutcome
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import RunSummary
from flowllm.spend.pricing import PriceTable
from flowllm.spend.spending import SHARED_SPENDER, RunBill, RunBudget, Spend, SpendBook
from flowllm.spend.task_usage import TaskBill

log = logging.getLogger(__name__)


def budget_spent(budget: RunBudget, run_dir: Path) -> bool:
    """Whether the run's ledger has reached ``experiment.budget`` (False without a budget)."""
    return budget.active and budget.reached(SpendBook.of_run(run_dir).total()) is not None


@dataclass(frozen=True)
class SharedReading:
    """What every process sharing the budget (``experiment.coordination``) spent, as read from Redis when the
    summary is written; ``error`` says why it could not be read (``spend`` is then None)."""

    spend: Spend | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """``summary.json``'s ``budget.shared_spent``."""
        spend = self.spend
        if spend is None:
            return {"cost_usd": None, "tokens": None, "error": self.error}
        return {"cost_usd": None if spend.unpriced_calls else round(spend.cost_usd, 6), "tokens": spend.tokens}


def shared_spend(budget: RunBudget, coordination: Coordination | None, run_dir: Path) -> SharedReading | None:
    """Under ``experiment.coordination``, what every process sharing the budget spent (this folder's ledger lines
    counted in first); None without a shared budget. Redis out of reach now is said on the console and kept."""
    if coordination is None or not budget.active:
        return None
    shared = RedisSpend(coordination)  # a client: it connects on its first command
    try:
        return SharedReading(SpendBook.of_run(run_dir, shared=shared).total())
    except OSError as exc:  # RedisSpend says a Redis failure as one, naming the server
        log.warning("flowllm: the shared spend (experiment.coordination) cannot be read: %s", exc)
        return SharedReading(None, f"not read when the summary was written: {exc}")
    finally:
        shared.close()


def budget_summary(
    budget: RunBudget,
    outcomes: Sequence[TaskOutcome],
    run_dir: Path,
    *,
    total: int,
    bills: Mapping[str, TaskBill],
    shared: SharedReading | None = None,
    seen: str | None = None,
) -> dict[str, Any]:
    """``summary.json``'s ``budget``: the caps, what the run's ledger adds up to, whether the budget ended the run,
    and what each task it left unfinished had used. With ``shared`` (``shared_spend``) the budget is the one the
    processes of ``experiment.coordination`` kept together: it ended this run when their spend reached it, though
    this folder's own may be far below (a shard started after the others had spent it). ``seen``: why a budget
    stopped tasks when this folder's ledgers cannot show it, said instead: the halt the run saw when the shared
    spend cannot be read now (``RunResult.budget_halt``), or a replay's saved run's (``SavedStops.reason``)."""
    spent = SpendBook.of_run(run_dir).total()
    halt = None
    if budget.active:
        basis = spent if shared is None or shared.spend is None else shared.spend
        halt = budget.reached(basis) if basis is spent else budget.reached(basis, SHARED_SPENDER)
    reason = halt.detail if halt is not None else seen
    stopped = [o for o in outcomes if o.status == BUDGET]
    unfinished: dict[str, Any] = {}
    for o in stopped:
        bill = bills.get(o.task_id)
        unfinished[o.task_id] = {
            "tokens": bill.total_tokens if bill is not None else o.usage.total_tokens,
            "cost_usd": None if bill is None or bill.cost_usd is None else round(bill.cost_usd, 6),
            "turns": o.turns,
        }
    finished = {o.task_id for o in outcomes if o.status != BUDGET}
    return {
        "cost_usd": budget.cost_usd,
        "tokens": budget.tokens,
        "spent": {
            "cost_usd": None if spent.unpriced_calls else round(spent.cost_usd, 6),
            "tokens": spent.tokens,
        },
        "ended_run": reason is not None and len(finished) < total,
        "reason": reason,
        "stopped_tasks": unfinished,  # stopped mid-task by the budget: what each had used
        "not_started": max(0, total - len(finished) - len(stopped)),
        "shared_spent": None if shared is None else shared.to_dict(),
    }


def budget_rows(summary: RunSummary) -> list[tuple[str, str]]:
    """The console's lines about limits and the budget (none when no cap acted)."""
    rows: list[tuple[str, str]] = []
    if summary.limits:
        shown = ", ".join(f"{name}: {count}" for name, count in summary.limits.items())
        rows.append(("ended by a limit", f"{summary.limited} ({shown})"))
    budget = summary.budget
    if budget is not None and budget.ended_run:
        rows.append(("[red]budget", f"[red]the budget ended the run: {budget.reason}"))
        for task_id, used in budget.stopped_tasks.items():
            cost = used.get("cost_usd")
            money = f", ${cost:.4f}" if cost is not None else ""
            rows.append(("  stopped", f"{task_id}: {used.get('tokens', 0):,} tokens{money}, {used.get('turns')} turns"))
        # A replay has no reply for what its saved run never ran: that run is the one to resume.
        where = "the replayed run's folder" if summary.replay is not None else "this folder"
        rows.append(
            (
                "  resume",
                f"{budget.not_started} not started; rerun into {where} with a higher experiment.budget to run the rest",
            )
        )
    return rows


def batch_cost(cost: Mapping[str, Any], prices: PriceTable, protocol: str, run_dir: Path) -> dict[str, Any]:
    """``summary.json``'s ``cost`` in batch mode (provider.batch): ``batch_factor`` when every billed call went
    through a batch (the ledger prices each call as it was made: ``billed_cost`` gives the total)."""
    out = dict(cost)
    billed = [a for a in UsageLedger.read(RunLayout(run_dir).ledger).attempt_lines() if a.billed]
    factor = prices.batch_factor(protocol)
    if factor is not None and billed and all(a.batch for a in billed):
        out["batch_factor"] = factor
    return out


COST_OF = "billed in this run folder: every call of every session and attempt (usage.jsonl, judge_usage.jsonl)"


def billed_cost(priced: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """``summary.json``'s ``cost``: what the run folder's ledgers say was billed, stopped tasks and the judge
    included, split agent / judge (``total_usd`` is the headline). What ``priced`` (the finished tasks' recorded
    tokens at the model's price) adds stays: its model and prices, and a replay's ``saved_run_usd``."""
    out = {k: v for k, v in priced.items() if k not in ("total_usd", "by_kind_usd")}
    out.update(RunBill.read(run_dir).to_dict(), of=COST_OF)
    if out["total_usd"] is not None and not (priced.get("replayed") or priced.get("forked")):
        out.pop("note", None)  # a note on a price the tasks' tokens lacked: the ledger priced every call
    return out
