"""The LLM judge: one model call per scored attempt, through the provider layer like any agent call.

    async with open_judge(cfg.judge, agent_provider_cfg, run_dir=..., redactor=...) as judge:
        score = await judge.score(task, answer, attempt=1)

* The call goes through ``open_provider``: retries, key pools, fallbacks and breakers of the judge's provider
  config (``judge.provider``, a ``conf/provider`` name, optionally ``<name>:<model>``), its attempts written to
  the judge's own ledger (``judge_usage.jsonl``), so its tokens and cost are counted apart from the agent's.
* It is recorded under the task in the agent's turn layout, ``tasks/<id>/judge/turn_<attempt>/01_call_model/``
  (``input.json``, ``output.json`` with ``raw_request``/``raw_response``, ``meta.json``), so inspect and the
  replay provider read it like any call, and the outcome in ``tasks/<id>/judge/turn_<attempt>/verdict.json``.
* ``verdict.json`` is the cache: a rerun into the same run folder (resume) that asks for the same judgement
  (same template, judge model, question, answer and ground truth) reads it instead of calling again.
* A reply without a verdict, or a call that failed after every retry and fallback, is a scoring error on the
  task (``Score.error``), never a silent "incorrect". Neither is reused: a resume asks the judge again for
  those tasks only (their agent runs are kept).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flowllm.config.provider_schema import ProviderConfig
from flowllm.config.schema import JudgeConfig
from flowllm.core.interfaces import CallContext, Provider
from flowllm.core.types import user_message
from flowllm.datasets.task import Task
from flowllm.engine.recorder import Redactor, atomic_write, read_json
from flowllm.errors import ConfigError, FlowError
from flowllm.providers.ledger import PriceLookup, UsageLedger
from flowllm.providers.registry import Resolver, RouteSpec
from flowllm.rundir.epochs import current_epoch
from flowllm.rundir.layout import INPUT_FILE, META_FILE, OUTPUT_FILE, VERDICT_FILE, RunLayout
from flowllm.scoring.scorers import Score
from flowllm.scoring.templates import TEMPLATES, JudgeTemplate, Verdict

JUDGE_AGENT = "judge"  # CallContext.agent: the emulator script key "<task_id>/judge", the ledger's agent column
JUDGE_SCOPE = "judge"  # the folder under the task
CALL_FOLDER = "01_call_model"
# Why an answer could not be judged (Score.details["error_kind"]).
NO_VERDICT = "no_verdict"  # the judge replied without a verdict: the judge's own parse failure
CALL_FAILED = "call_failed"  # every retry and fallback failed


def judge_dir(run_dir: Path, task_id: str, attempt: int) -> Path:
    """The judge's call for an attempt, under the task (or under its epoch, in an ``experiment.epochs`` run)."""
    return RunLayout(run_dir).records(task_id, current_epoch()) / JUDGE_SCOPE / f"turn_{attempt:03d}"


def judge_template(name: str) -> JudgeTemplate:
    return TEMPLATES.require(name)


def judge_provider_config(judge: JudgeConfig, resolve: Resolver) -> ProviderConfig:
    """The judge's provider config: ``judge.provider`` resolved like a fallback name (``resolve``: the run's
    set-up reads it), with the judge's overrides (model, max_tokens, emulator_script, run_dir) applied."""
    if not judge.provider:
        raise ConfigError(
            "dataset.scorer=judge needs a judge: add judge.provider=<name of a conf/provider config> "
            "(e.g. judge.provider=gpt5, or judge.provider=claude:claude-haiku-4-5)"
        )
    spec = RouteSpec.parse(judge.provider)
    if not spec.provider:
        raise ConfigError(f"judge.provider '{judge.provider}' names no provider config")
    cfg = resolve(spec.provider)
    changes: dict[str, Any] = {"max_tokens": judge.max_tokens}
    if spec.model:
        changes["model"] = spec.model
    if judge.emulator_script:
        from flowllm.providers.factory import resolve_script

        changes["emulator_script"] = str(resolve_script(judge.emulator_script))
    if judge.run_dir:
        changes["run_dir"] = judge.run_dir
    return replace(cfg, **changes)


def _cache_key(template: str, model: str, task: Task, answer: str) -> str:
    payload = json.dumps([template, model, task.question, answer, task.ground_truth], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


class JudgeScorer:
    """Scores an answer by asking the judge model with a benchmark's published grader prompt."""

    name = "judge"
    rules: None = None  # a model decides: a resume reads the saved verdict

    def __init__(
        self,
        provider: Provider,
        template: JudgeTemplate,
        *,
        run_dir: Path,
        redactor: Redactor | None = None,
        provider_name: str | None = None,
    ) -> None:
        self.provider = provider
        self.template = template
        self.run_dir = Path(run_dir)
        self.redactor = redactor or Redactor()
        self.provider_name = provider_name or provider.name
        self.model = provider.model

    def _write(self, path: Path, value: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, self.redactor.dumps(value))

    def _cached(self, folder: Path, key: str) -> Score | None:
        path = folder / VERDICT_FILE
        if not path.is_file():
            return None
        try:
            saved = read_json(path)
        except Exception:
            return None  # a half-written file of a killed run: judge again
        # A reply without a verdict is recorded but not reused: a resume asks again, as after a failed call.
        if not isinstance(saved, dict) or saved.get("key") != key or saved.get("error"):
            return None
        details = {**(saved.get("details") or {}), "cached": True}
        return Score(bool(saved.get("correct")), saved.get("error"), saved.get("verdict"), details)

    async def score(self, task: Task, answer: str | None, *, attempt: int) -> Score:
        base = {"judge_model": self.model, "judge_provider": self.provider_name, "template": self.template.name}
        if task.ground_truth is None:  # nothing to judge against (a test split): unscored, not wrong
            return Score(None, details={**base, "reason": "no ground truth"})
        if answer is None:
            return Score(False, verdict=Verdict.INCORRECT.value, details={**base, "reason": "no answer to judge"})
        folder = judge_dir(self.run_dir, task.task_id, attempt)
        key = _cache_key(self.template.name, self.model, task, answer)
        cached = self._cached(folder, key)
        if cached is not None:
            return cached
        prompt = self.template.render(question=task.question, response=answer, correct_answer=task.ground_truth)
        request = self.provider.build_request(system=[], messages=[user_message(prompt)], tools=[])
        context = CallContext(task.task_id, attempt, agent=JUDGE_AGENT, scope=JUDGE_SCOPE)
        call_dir = folder / CALL_FOLDER
        started_at = datetime.now(UTC).isoformat()
        started = time.perf_counter()
        self._write(call_dir / INPUT_FILE, {"prompt": prompt, "raw_request": request})
        try:
            raw = await self.provider.send(request, context=context)
            reply = self.provider.normalize(raw)
        except FlowError as exc:  # every retry and fallback failed: a scoring error, asked again on resume
            self._write(
                call_dir / META_FILE,
                {"node": "call_model", "turn": attempt, "status": "error", "error": str(exc), "started_at": started_at},
            )
            return Score(None, error=f"judge call failed: {exc}", details={**base, "error_kind": CALL_FAILED})
        duration = round(time.perf_counter() - started, 6)
        self._write(call_dir / OUTPUT_FILE, {"raw_request": request, "raw_response": raw})
        self._write(
            call_dir / META_FILE,
            {"node": "call_model", "turn": attempt, "status": "ok", "started_at": started_at, "duration_s": duration},
        )
        verdict = self.template.parse(reply.text)
        details = {**base, "judge_model": reply.model or self.model, "usage": reply.usage.to_dict(), "cached": False}
        if verdict is None:
            shown = " ".join(reply.text.split())[:200] or "(empty)"
            details["error_kind"] = NO_VERDICT
            score = Score(None, error=f"the judge's reply gives no verdict: {shown}", details=details)
        else:
            score = Score(verdict is Verdict.CORRECT, verdict=verdict.value, details=details)
        self._write(
            folder / VERDICT_FILE,
            {
                "key": key,
                "correct": score.correct,
                "verdict": score.verdict,
                "error": score.error,
                "reply": reply.text,
                "details": details,
            },
        )
        return score


@asynccontextmanager
async def open_judge(
    judge: JudgeConfig,
    provider_cfg: ProviderConfig,
    *,
    run_dir: Path,
    redactor: Redactor | None = None,
    prices: PriceLookup | None = None,
    resolve: Resolver | None = None,
) -> AsyncIterator[JudgeScorer]:
    """The judge, open for the run: its provider (and emulator, when scripted) and its own ledger; ``resolve``
    gives the configs its fallbacks name."""
    from flowllm.providers.factory import open_provider

    template = judge_template(judge.template)
    ledger = UsageLedger(RunLayout(Path(run_dir)).judge_ledger, prices=prices)
    try:
        async with open_provider(provider_cfg, ledger=ledger, resolve=resolve) as provider:
            yield JudgeScorer(provider, template, run_dir=run_dir, redactor=redactor, provider_name=provider_cfg.name)
    finally:
        ledger.close()


def judge_summary(run_dir: Path) -> dict[str, Any] | None:
    """The judge's calls, tokens and cost from its ledger (None when it was never called in this folder)."""
    path = RunLayout(Path(run_dir)).judge_ledger
    if not path.is_file():
        return None
    return UsageLedger.read(path).summary()
