"""``inspect scale --judge NAME``: best-of-k, a judge model picking one answer among a task's first k epochs.

For each task and k >= 2, the distinct answers of its first k scored epochs (in order of first appearance) are put
to the judge with the task's question (read from its first recorded model call); the judge replies with the
number of the best in ``\\boxed{}``, and the task scores the verdict that answer already had. One distinct answer
needs no call. A reply without a usable number falls back to the majority answer (counted as ``no_pick``).
Unlike the other figures, best-of-k is one draw per task (its first k epochs), not an average over the
k-subsets of its epochs (that would cost a judge call per subset): its interval says how far to trust it.

Each call is recorded like any judge call (flowllm/scoring/judge.py): under the task, in
``judge/rerank/k<NN>/01_call_model/`` (``input.json``, ``output.json`` with the raw request and reply,
``meta.json``) with the outcome and its cache key in ``verdict.json``, its attempts in the run's
``rerank_usage.jsonl`` ledger (agent ``rerank``, turn k). A second ``scale`` with the same judge reads the
verdicts back and calls nothing; the cost it reports is the recorded calls' cost from that ledger.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from flowllm.analysis.epoch_runs import RunEpochs, TaskEpochs
from flowllm.analysis.scaling import Bootstrap, Point, majority_verdict
from flowllm.config.provider_schema import ProviderConfig
from flowllm.config.providers import FileResolver
from flowllm.core.interfaces import CallContext, Provider
from flowllm.core.types import user_message
from flowllm.engine.recorder import atomic_write, read_json
from flowllm.errors import CliError, FlowError
from flowllm.export.ledger import read_ledger
from flowllm.providers.factory import open_provider, resolve_script
from flowllm.providers.ledger import UsageLedger
from flowllm.providers.registry import RouteSpec
from flowllm.resources import bundled
from flowllm.rundir.layout import INPUT_FILE, META_FILE, OUTPUT_FILE, VERDICT_FILE, RunLayout
from flowllm.spend.pricing import PriceTable

__all__ = ["RERANK_LEDGER", "best_of_k", "judge_provider"]

RERANK_AGENT = "rerank"
RERANK_SCOPE = "judge/rerank"
RERANK_LEDGER = "rerank_usage.jsonl"
_BOXED = re.compile(r"\\boxed\{\s*(\d+)\s*\}")


class JudgeUnavailable(CliError):
    """``--judge`` names no provider config that can be opened: exit status 2."""


def judge_provider(name: str, script: str | None) -> ProviderConfig:
    """``--judge NAME[:MODEL]`` read like ``judge.provider``, with ``--judge-script`` as its emulator script."""
    spec = RouteSpec.parse(name)
    try:
        cfg = FileResolver()(spec.provider or name)
    except FlowError as exc:
        raise JudgeUnavailable(f"--judge {name}: {exc}") from None
    changes: dict[str, Any] = {}
    if spec.model:
        changes["model"] = spec.model
    if script:
        changes["emulator_script"] = str(resolve_script(script))
    return replace(cfg, **changes)


def _question(run_dir: Path, task_id: str) -> str:
    """The first user message of the task's first recorded model call (its first epoch when it has epochs)."""
    task = RunLayout(run_dir).task(task_id)
    for path in sorted(task.glob("epochs/1/turn_001/*call_model/input.json")) + sorted(
        task.glob("turn_001/*call_model/input.json")
    ):
        for message in read_json(path).get("prompt_messages") or []:
            if message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    return content
                return "\n".join(b.get("text", "") for b in content or [] if b.get("type") == "text")
    return "(the question was not recorded)"


def _prompt(question: str, candidates: list[str]) -> str:
    listed = "\n".join(f"{i}. {answer}" for i, answer in enumerate(candidates, start=1))
    return (
        f"A question and {len(candidates)} candidate answers to it. Which answer is most likely correct?\n\n"
        f"Question: {question}\n\nCandidates:\n{listed}\n\n"
        "Reply with the number of the best candidate inside \\boxed{}, e.g. \\boxed{1}."
    )


class _Ranker:
    def __init__(self, provider: Provider, run_dir: Path) -> None:
        self.provider, self.run_dir = provider, run_dir
        self.calls = self.replayed = self.no_pick = 0

    def _write(self, path: Path, value: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(value, ensure_ascii=False, indent=2).encode())

    async def pick(self, task: TaskEpochs, k: int, candidates: list[str]) -> int | None:
        """The judge's choice (0-based) among ``candidates``; None when its reply names none."""
        prompt = _prompt(_question(self.run_dir, task.task_id), candidates)
        key = hashlib.sha256(json.dumps([self.provider.model, prompt]).encode()).hexdigest()
        folder = RunLayout(self.run_dir).task(task.task_id) / RERANK_SCOPE / f"k{k:02d}"
        saved = read_json(folder / VERDICT_FILE) if (folder / VERDICT_FILE).is_file() else None
        if isinstance(saved, dict) and saved.get("key") == key:
            self.replayed += 1
            return saved.get("pick")
        request = self.provider.build_request(system=[], messages=[user_message(prompt)], tools=[])
        self._write(folder / "01_call_model" / INPUT_FILE, {"prompt": prompt, "raw_request": request})
        raw = await self.provider.send(request, context=CallContext(task.task_id, k, RERANK_AGENT, RERANK_SCOPE))
        reply = self.provider.normalize(raw)
        self.calls += 1
        self._write(folder / "01_call_model" / OUTPUT_FILE, {"raw_request": request, "raw_response": raw})
        self._write(folder / "01_call_model" / META_FILE, {"node": "call_model", "turn": k, "status": "ok"})
        found = _BOXED.search(reply.text)
        pick = int(found.group(1)) - 1 if found and 1 <= int(found.group(1)) <= len(candidates) else None
        self._write(folder / VERDICT_FILE, {"key": key, "pick": pick, "candidates": candidates, "reply": reply.text})
        return pick

    async def score(self, task: TaskEpochs, k: int) -> float:
        first = task.epochs[:k]
        candidates = list(dict.fromkeys(e.answer for e in first))
        if len(candidates) == 1:
            return float(first[0].correct)
        pick = await self.pick(task, k, candidates)
        if pick is None:
            self.no_pick += 1
            return float(majority_verdict(first))
        return float(next(e.correct for e in first if e.answer == candidates[pick]))


def _judge_costs(run_dir: Path) -> dict[tuple[str, int], float | None]:
    """(task, k) -> what the recorded rerank calls cost (None: not priced)."""
    costs: dict[tuple[str, int], float | None] = defaultdict(float)
    for line in read_ledger(run_dir / RERANK_LEDGER):  # every billed attempt, a paid-for empty reply among them
        if line.type == "attempt" and line.billed and line.task_id is not None and line.turn is not None:
            before = costs[(line.task_id, line.turn)]
            costs[(line.task_id, line.turn)] = (
                None if before is None or line.cost_usd is None else before + line.cost_usd
            )
    return costs


async def _scores(run: RunEpochs, tasks: list[TaskEpochs], max_k: int, cfg: ProviderConfig) -> tuple[dict, _Ranker]:
    ledger = UsageLedger(run.path / RERANK_LEDGER, prices=PriceTable.load(bundled("conf/pricing.yaml")))
    try:
        async with open_provider(cfg, ledger=ledger) as provider:
            ranker = _Ranker(provider, run.path)
            scores = {k: [await ranker.score(t, k) for t in tasks if t.n >= k] for k in range(2, max_k + 1)}
    finally:
        ledger.close()
    return scores, ranker


def best_of_k(run: RunEpochs, task_ids: list[str], max_k: int, cfg: ProviderConfig, bootstrap: Bootstrap) -> dict:
    """The run's best-of-k curve: each k's accuracy, interval and cost per task (k epochs and the judge's calls),
    and how many calls were made now and how many read back."""
    tasks = [run.tasks[t] for t in task_ids]
    scores, ranker = asyncio.run(_scores(run, tasks, max_k, cfg))
    judge_costs = _judge_costs(run.path)
    curve = {}
    for k, values in scores.items():
        used = [t for t in tasks if t.n >= k]
        costs = [
            None
            if t.epoch_cost_usd is None or judge_costs.get((t.task_id, k), 0.0) is None
            else k * t.epoch_cost_usd + float(judge_costs.get((t.task_id, k), 0.0) or 0.0)
            for t in used
        ]
        cost = None if any(c is None for c in costs) else math.fsum(c or 0.0 for c in costs) / len(costs)
        mean = math.fsum(values) / len(values) if values else None
        curve[k] = Point(mean, bootstrap.interval(values), len(values), cost)
    return {
        "curve": curve,
        "calls": ranker.calls,
        "replayed": ranker.replayed,
        "no_pick": ranker.no_pick,
        "judge_model": cfg.model,
    }
