"""An example flowllm plug-in: one repair stage and one scorer, found through the package's entry points.

* ``repair.stages=[stamped_strict,...]``: reads strict JSON like the built-in ``strict`` stage; a call it read is
  recorded under its name (``repairs`` in result.json), so a run shows the plug-in acted;
* ``dataset.scorer=casefold``: an answer is right when it equals the ground truth after case folding; the
  verdict says so (``correct`` | ``incorrect``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from flowllm.datasets.task import Task
from flowllm.parsing.repair.stages import Found, Stage, StageResult
from flowllm.scoring import Score, ScorerSettings


def _read_strict(text: str, key: str | None) -> StageResult:
    try:
        return Found(json.loads(text))
    except ValueError:
        return None  # not this stage's to read: the next stage of the chain tries


# A Stage names whether an unparsed rewrite goes on to the next stages (carries); a bare function works too.
stamped_strict = Stage("stamped_strict", _read_strict, False, "strict JSON, recorded under the plug-in's name")


class CasefoldScorer:
    name = "casefold"

    def rules(self, task: Task, answer: str | None) -> bool | None:
        if task.ground_truth is None:
            return None
        return (answer or "").strip().casefold() == task.ground_truth.strip().casefold()

    async def score(self, task: Task, answer: str | None, *, attempt: int) -> Score:
        correct = self.rules(task, answer)
        verdict = None if correct is None else "correct" if correct else "incorrect"
        return Score(correct, verdict=verdict)


@asynccontextmanager
async def open_casefold(settings: ScorerSettings) -> AsyncIterator[Any]:
    yield CasefoldScorer()
