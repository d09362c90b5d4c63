"""Scoring: a small registry of scorers chosen by ``dataset.scorer`` (gaia | exact | judge).

async with open_scorer(cfg.dataset.scorer, judge=..., run_dir=...) as scorer:
    score = await scorer.score(task, answer, attempt=1)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from flowllm.config.schema import JudgeConfig, ProviderConfig
from flowllm.engine.recorder import Redactor
from flowllm.errors import ConfigError
from flowllm.providers.ledger import PriceLookup
from flowllm.scoring.judge import JudgeScorer, judge_provider_config, judge_summary, judge_template, open_judge
from flowllm.scoring.scorers import SCORERS, ExactScorer, GaiaScorer, Score, Scorer, normalize_answer

__all__ = [
    "SCORERS",
    "ExactScorer",
    "GaiaScorer",
    "JudgeScorer",
    "Score",
    "Scorer",
    "check_scorer",
    "judge_provider_config",
    "judge_summary",
    "normalize_answer",
    "open_scorer",
]


def check_scorer(name: str) -> None:
    if name not in SCORERS:
        raise ConfigError(f"dataset.scorer must be one of {', '.join(SCORERS)}, not '{name}'")


@asynccontextmanager
async def open_scorer(
    name: str,
    *,
    judge: JudgeConfig | None = None,
    judge_provider: ProviderConfig | None = None,
    run_dir: Path,
    redactor: Redactor | None = None,
    prices: PriceLookup | None = None,
) -> AsyncIterator[Scorer]:
    """The configured scorer, open for the run (the judge's provider is opened only for ``judge``)."""
    check_scorer(name)
    if name == "gaia":
        yield GaiaScorer()
    elif name == "exact":
        yield ExactScorer()
    else:
        if judge is None or judge_provider is None:
            raise ConfigError("dataset.scorer=judge needs judge.provider")
        judge_template(judge.template)
        async with open_judge(judge, judge_provider, run_dir=run_dir, redactor=redactor, prices=prices) as scorer:
            yield scorer
