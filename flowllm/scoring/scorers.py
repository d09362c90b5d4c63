"""Scorers: how an answer is judged against the ground truth, chosen by ``dataset.scorer``.

* ``gaia``: GAIA's ``question_scorer`` rules (numbers, lists, normalised strings; flowllm/datasets/gaia.py);
* ``exact``: normalised exact match (lowercase, no punctuation, no articles, single spaces), the usual rule
  of short-answer QA sets;
* ``judge``: an LLM judge through the provider layer (flowllm/scoring/judge.py).

A task without ground truth (a GAIA row with no ``Final answer``, a test split) is unscored: its ``correct`` is
None, never False, and accuracy is computed over the scored tasks only. A scorer never raises for a task:
what went wrong is a ``Score`` with ``error`` set (a scoring error on that task, counted in the summary), never
a silent zero.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from flowllm.datasets.gaia import question_scorer
from flowllm.datasets.task import Task


@dataclass(frozen=True)
class Score:
    correct: bool | None  # None: unscored (the task has no ground truth, or its answer could not be judged)
    error: str | None = None  # a scoring error: the answer could not be judged (``correct`` is None: not known)
    verdict: str | None = None  # the judge's (correct | incorrect | not_attempted)
    details: dict[str, Any] = field(default_factory=dict)  # judge model, cached, ...


# The score by rules alone (no model): what a resume recomputes from a saved answer.
RuleScore = Callable[[Task, str | None], bool | None]  # None: unscored (no ground truth)


class Scorer(Protocol):
    name: str

    @property
    def rules(self) -> RuleScore | None:
        """The scorer's rules when it scores by rules alone; None when a model decides (a judge), whose saved
        verdict a resume reads instead."""
        ...

    async def score(self, task: Task, answer: str | None, *, attempt: int) -> Score: ...


class GaiaScorer:
    name = "gaia"

    def rules(self, task: Task, answer: str | None) -> bool | None:
        """The score by rules alone (no model): what a resume recomputes from a saved answer; None (unscored)
        when the task has no ground truth."""
        if task.ground_truth is None:
            return None
        return question_scorer(answer, task.ground_truth)

    async def score(self, task: Task, answer: str | None, *, attempt: int) -> Score:
        return Score(self.rules(task, answer))


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and English articles, collapse whitespace."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


class ExactScorer:
    name = "exact"

    def rules(self, task: Task, answer: str | None) -> bool | None:
        """The score by rules alone (no model): what a resume recomputes from a saved answer; None (unscored)
        when the task has no ground truth."""
        if task.ground_truth is None:
            return None
        if answer is None:
            return False
        return normalize_answer(answer) == normalize_answer(task.ground_truth)

    async def score(self, task: Task, answer: str | None, *, attempt: int) -> Score:
        return Score(self.rules(task, answer))
