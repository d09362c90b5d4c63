"""Scoring: a small registry of scorers chosen by ``dataset.scorer`` (gaia | exact | judge, and those installed
packages add under the entry-point group ``flowllm.scorers``: a function of ``ScorerSettings`` returning an async
context manager that yields a ``Scorer``).

async with open_scorer(cfg.dataset.scorer, judge=..., run_dir=...) as scorer:
    score = await scorer.score(task, answer, attempt=1)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowllm.config.provider_schema import ProviderConfig
from flowllm.config.schema import JudgeConfig
from flowllm.core.registry import Registry
from flowllm.engine.recorder import Redactor
from flowllm.errors import ConfigError
from flowllm.providers.ledger import PriceLookup
from flowllm.providers.registry import Resolver
from flowllm.scoring.judge import JudgeScorer, judge_provider_config, judge_summary, judge_template, open_judge
from flowllm.scoring.scorers import ExactScorer, GaiaScorer, Score, Scorer, normalize_answer

__all__ = [
    "SCORERS",
    "ExactScorer",
    "GaiaScorer",
    "JudgeScorer",
    "Score",
    "Scorer",
    "ScorerSettings",
    "check_scorer",
    "judge_provider_config",
    "judge_summary",
    "normalize_answer",
    "open_scorer",
]


@dataclass(frozen=True)
class ScorerSettings:
    """What a scorer may need to open: the judge's settings and provider, where the run is, its redactor and
    price table, and the provider configs the judge's fallbacks name (resolved by the run's set-up)."""

    run_dir: Path
    judge: JudgeConfig | None = None
    judge_provider: ProviderConfig | None = None
    redactor: Redactor | None = None
    prices: PriceLookup | None = None
    providers: Resolver | None = None


ScorerOpener = Callable[[ScorerSettings], AbstractAsyncContextManager[Scorer]]


@asynccontextmanager
async def _open_gaia(settings: ScorerSettings) -> AsyncIterator[Scorer]:
    yield GaiaScorer()


@asynccontextmanager
async def _open_exact(settings: ScorerSettings) -> AsyncIterator[Scorer]:
    yield ExactScorer()


@asynccontextmanager
async def _open_judge(settings: ScorerSettings) -> AsyncIterator[Scorer]:
    judge, provider = settings.judge, settings.judge_provider
    if judge is None or provider is None:
        raise ConfigError("dataset.scorer=judge needs judge.provider")
    judge_template(judge.template)
    async with open_judge(
        judge,
        provider,
        run_dir=settings.run_dir,
        redactor=settings.redactor,
        prices=settings.prices,
        resolve=settings.providers,
    ) as scorer:
        yield scorer


def _scorer_opener(name: str, loaded: Any) -> ScorerOpener:
    if not callable(loaded):
        raise TypeError(f"expected a function of ScorerSettings returning an async context manager, got {loaded!r}")
    return loaded


# The scorers ``dataset.scorer`` chooses from, by name; a plug-in adds one under ``flowllm.scorers``.
SCORERS: Registry[ScorerOpener] = Registry(
    "dataset.scorer",
    {"gaia": _open_gaia, "exact": _open_exact, "judge": _open_judge},
    group="flowllm.scorers",
    adapt=_scorer_opener,
)


def check_scorer(name: str) -> None:
    SCORERS.require(name)


@asynccontextmanager
async def open_scorer(
    name: str,
    *,
    judge: JudgeConfig | None = None,
    judge_provider: ProviderConfig | None = None,
    run_dir: Path,
    redactor: Redactor | None = None,
    prices: PriceLookup | None = None,
    providers: Resolver | None = None,
) -> AsyncIterator[Scorer]:
    """The configured scorer, open for the run (the judge's provider is opened only for ``judge``)."""
    opener = SCORERS.require(name)
    settings = ScorerSettings(run_dir, judge, judge_provider, redactor, prices, providers)
    async with opener(settings) as scorer:
        yield scorer
