"""What a fork spent and what it saved: ``summary.json`` → ``fork``.

A fork (``provider.fork=live``, flowllm/providers/fork.py) replays each task until its first turn that differs
and calls the live provider from there. Its live calls are billed in this run's ``usage.jsonl`` like any run's;
the cost a full live re-run of the same tasks would have had is the one the saved run was billed for them (the
ledger of the run that first called a model, following replays of replays). The saving is their difference.
Either figure is null ("not known") when its ledger is missing or holds an unpriced call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from flowllm.config.provider_schema import ProviderConfig
from flowllm.providers.replay import REPLAY_PROTOCOL, resolve_run_dir, source_provider_config
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import ForkBlock
from flowllm.spend.task_usage import TaskBill, read_bills

NOTE = "the live calls after the forks (usage.jsonl); the replayed turns cost nothing"


def _bills_total(bills: dict[str, TaskBill], task_ids: Iterable[str]) -> tuple[int, float | None, int]:
    """(model calls, cost or None when a call was unpriced, tokens) of ``task_ids``."""
    calls = tokens = 0
    cost: float | None = 0.0
    for task_id in task_ids:
        bill = bills.get(task_id)
        if bill is None:
            continue
        calls += bill.calls
        tokens += bill.total_tokens
        cost = None if cost is None or bill.cost_usd is None else cost + bill.cost_usd
    return calls, None if cost is None else round(cost, 6), tokens


def origin_run(run_dir: Path) -> Path:
    """The run that called a model for the replies ``run_dir`` holds (itself unless it was a replay)."""
    _source, chain = source_provider_config(run_dir)
    return chain[-1]


def is_fork(provider_cfg: ProviderConfig) -> bool:
    return provider_cfg.protocol == REPLAY_PROTOCOL and provider_cfg.fork is not None and bool(provider_cfg.run_dir)


def fork_summary(provider_cfg: ProviderConfig, task_ids: Sequence[str], run_dir: Path) -> dict[str, Any]:
    """The ``fork`` section of a fork's summary and its ``cost`` (what this run spent); {} for any other run."""
    if not is_fork(provider_cfg):
        return {}
    assert provider_cfg.run_dir is not None
    saved = origin_run(resolve_run_dir(provider_cfg.run_dir))
    live_calls, live_cost, live_tokens = _bills_total(read_bills(run_dir), task_ids)
    full: tuple[int | None, float | None, int | None] = (None, None, None)
    if RunLayout(saved).ledger.is_file():
        full = _bills_total(read_bills(saved), task_ids)
    full_calls, full_cost, _full_tokens = full
    fork = {
        "live": str(provider_cfg.live),
        "fork_at_turn": provider_cfg.fork_at_turn,
        "saved_run": str(saved),
        "live_calls": live_calls,
        "live_tokens": live_tokens,
        "live_cost_usd": live_cost,
        "full_rerun_calls": full_calls,
        "full_rerun_cost_usd": full_cost,
        "saved_calls": None if full_calls is None else full_calls - live_calls,
        "saved_usd": None if full_cost is None or live_cost is None else round(full_cost - live_cost, 6),
    }
    cost = {"total_usd": live_cost, "model": str(provider_cfg.live), "note": NOTE, "forked": True}
    return {"fork": fork, "cost": cost, "cost_usd": live_cost}


def fork_rows(fork: ForkBlock | None) -> list[tuple[str, str]]:
    """The console's lines for a fork's spending (``summary.json → fork``; none for another run)."""
    if fork is None:
        return []

    def usd(value: Any) -> str:
        return "not known" if value is None else f"${float(value):.4f}"

    def calls(value: Any) -> str:
        return "not known" if value is None else f"{int(value):,} calls"

    return [
        ("fork: live spent", f"{usd(fork.live_cost_usd)} ({calls(fork.live_calls)}, {fork.live})"),
        (
            "fork: full live re-run",
            f"{usd(fork.full_rerun_cost_usd)} ({calls(fork.full_rerun_calls)}, the saved run's ledger)",
        ),
        ("fork: saved", f"{usd(fork.saved_usd)} ({calls(fork.saved_calls)})"),
    ]
