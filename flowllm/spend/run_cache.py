"""A run folder's prompt caching: the cache hit rate per task and run, and the input cost against the bound.

The hit rate and what was billed come from the usage ledger (what the provider reported); the bound from the
prompts the run sent (every ``call_model`` node's ``raw_request``, sub-agents and compaction calls included,
in the order their records were written), through ``flowllm.spend.cache_bound``. Input cost only, at the
run's own prices (``summary.json``'s ``cost.price_per_million``), else the bundled price table's. One-hour
writes count at their own price; when a task wrote any, its bound is the cheaper of the five-minute and the
one-hour TTL's (both are billings the provider allows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flowllm.providers.ledger import UsageLedger
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.records import held_exchange
from flowllm.rundir.results import LedgerLine, RunSummary
from flowllm.spend.cache_bound import (
    DEFAULT_TTL_S,
    ONE_HOUR_TTL_S,
    InputBill,
    SentPrompt,
    cache_bound,
    sent_prompt,
)
from flowllm.spend.pricing import ONE_HOUR_WRITE, PRICE_FIELDS, Price, PriceTable

DEFAULT_PRICES = Path(__file__).resolve().parent.parent / "conf" / "pricing.yaml"


@dataclass
class TaskCache:
    task_id: str
    billed: InputBill = field(default_factory=InputBill)  # from the ledger
    bound: InputBill = field(default_factory=InputBill)  # from the prompts sent
    prompts: int = 0

    def to_dict(self, price: Price | None) -> dict[str, Any]:
        billed_usd = round(self.billed.cost(price), 6) if price else None
        bound_usd = round(self.bound.cost(price), 6) if price else None
        one_hour = {"cache_write_1h_tokens": self.billed.written_1h} if self.billed.written_1h else {}
        return {
            "task_id": self.task_id,
            "input_tokens": self.billed.prompt_tokens,
            "cache_read_tokens": self.billed.read,
            "cache_write_tokens": self.billed.written,
            **one_hour,
            "hit_rate": self.billed.hit_rate,
            "billed_input_usd": billed_usd,
            "bound_input_usd": bound_usd,
            "over_bound": billed_usd / bound_usd if billed_usd is not None and bound_usd else None,
        }


@dataclass
class RunCache:
    run_dir: Path
    tasks: dict[str, TaskCache]
    price: Price | None
    model: str | None

    @property
    def run(self) -> TaskCache:
        whole = TaskCache("(run)")
        for task in self.tasks.values():
            whole.billed.add(task.billed)
            whole.bound.add(task.bound)
            whole.prompts += task.prompts
        return whole

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": str(self.run_dir),
            "model": self.model,
            "tasks": [t.to_dict(self.price) for _, t in sorted(self.tasks.items())],
            "total": self.run.to_dict(self.price),
        }


def _price(run_dir: Path, model: str | None) -> Price | None:
    summary_path = RunLayout(run_dir).summary
    if summary_path.is_file():
        summary = RunSummary.from_dict(orjson.loads(summary_path.read_bytes()))
        per_million = summary.cost.price_per_million if summary.cost is not None else None
        if per_million:
            one_hour = per_million.get(ONE_HOUR_WRITE)
            prices = {k: float(per_million[k]) for k in PRICE_FIELDS}
            return Price(**prices, cache_write_1h=None if one_hour is None else float(one_hour))
    return PriceTable.load(DEFAULT_PRICES).lookup(model)


# The records that hold a prompt the run sent: each turn's call node's, and compaction's (its summary call, kept
# in its own output: ``held_exchange``).
PROMPT_RECORDS = ("*/**/*_call_model/output.json", "*/**/*_compact_history/output.json")


def _sent(path: Path) -> dict[str, Any] | None:
    try:
        value = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        return None
    if path.parent.name.endswith("_call_model"):
        body = value.get("raw_request") if isinstance(value, dict) else None
        return body if isinstance(body, dict) else None
    held = held_exchange(value)
    return held[0] if held is not None else None


def _prompts(run_dir: Path, protocols: dict[str, str]) -> list[SentPrompt]:
    prompts = []
    tasks = RunLayout(run_dir).tasks
    for path in (path for pattern in PROMPT_RECORDS for path in tasks.glob(pattern)):
        task_id = path.relative_to(tasks).parts[0]
        body = _sent(path)
        if body is None:
            continue
        prompt = sent_prompt(protocols.get(task_id, ""), body, path.stat().st_mtime, task_id)
        if prompt is not None:
            prompts.append(prompt)
    return prompts


def run_cache(run_dir: Path | str) -> RunCache:
    """The run's cache figures per task (ledger and prompts), priced at the run's prices."""
    run_dir = Path(run_dir)
    lines: list[LedgerLine] = []
    ledger = RunLayout(run_dir).ledger
    if ledger.is_file():
        lines = [line for line in UsageLedger.read(ledger).attempt_lines() if line.billed]
    tasks: dict[str, TaskCache] = {}
    protocols: dict[str, str] = {}
    for line in lines:
        task = tasks.setdefault(line.task_id or "(none)", TaskCache(line.task_id or "(none)"))
        usage = line.usage or {}
        task.billed.add(
            InputBill(
                int(usage.get("input_tokens") or 0),
                int(usage.get("cache_read_tokens") or 0),
                int(usage.get("cache_write_tokens") or 0),
                int(usage.get("cache_write_1h_tokens") or 0),
            )
        )
        protocols.setdefault(line.task_id or "", line.protocol or "")
    prompts = _prompts(run_dir, protocols)
    model = next((line.model for line in lines if line.model), None)
    price = _price(run_dir, model)
    bounds = _bounds(prompts, tasks, price)
    for prompt in prompts:
        task = tasks.setdefault(prompt.task, TaskCache(prompt.task))
        task.prompts += 1
    for task_id, bound in bounds.items():
        tasks[task_id].bound = bound
    return RunCache(run_dir, tasks, price, model)


def _by_task(prompts: list[SentPrompt], ttl_s: float) -> dict[str, InputBill]:
    bounds: dict[str, InputBill] = {}
    for prompt, bill in zip(prompts, cache_bound(prompts, ttl_s), strict=True):
        bounds.setdefault(prompt.task, InputBill()).add(bill)
    return bounds


def _bounds(prompts: list[SentPrompt], tasks: dict[str, TaskCache], price: Price | None) -> dict[str, InputBill]:
    """Each task's bound: the five-minute TTL's, or the one-hour TTL's where the run wrote with it and that
    is cheaper (prompts of different tasks share no cache, so each task's cheaper choice is its own)."""
    bounds = _by_task(prompts, DEFAULT_TTL_S)
    if price is None or not any(t.billed.written_1h for t in tasks.values()):
        return bounds
    for task_id, hour in _by_task(prompts, ONE_HOUR_TTL_S).items():
        if hour.cost(price) < bounds[task_id].cost(price):
            bounds[task_id] = hour
    return bounds
