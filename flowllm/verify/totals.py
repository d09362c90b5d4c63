"""The summary's figures recomputed from the checked task outcomes: tallies, accuracy overall and by level,
the statistics block (every interval recomputed, not re-read), and a replay's accounting.

The counting rule is the README's: a task counts when it finished (completed, failed, or ended by a per-task
limit); a task the run's budget stopped is unfinished and counts in neither ``scored`` nor ``unscored``.
Among the counted, ``correct`` null is unscored.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar

from flowllm.config.schema import IntervalMethod, Reducer
from flowllm.core.types import Usage
from flowllm.run.outcome import BUDGET, COMPLETED, FAILED, LIMIT, TaskOutcome
from flowllm.run.replay_audit import replay_summary
from flowllm.run.stats import run_stats
from flowllm.scoring.stats import StatsSettings
from flowllm.scoring.tally import score_tally
from flowllm.verify.evidence import RunEvidence
from flowllm.verify.findings import Audit, same

__all__ = ["check_leaves", "check_totals"]

SUMMARY = "summary.json"


TALLY = "the task results, checked"


def check_leaves(audit: Audit, file: str, path: str, saved: Any, recomputed: Any) -> None:
    """Compare two JSON values leaf by leaf, so a finding names the exact field (``stats.accuracy.ci95``)."""
    if isinstance(saved, Mapping) and isinstance(recomputed, Mapping):
        for key in dict.fromkeys([*saved, *recomputed]):
            check_leaves(audit, file, f"{path}.{key}", saved.get(key), recomputed.get(key))
        return
    audit.check(file, path, saved, recomputed)


def counted(outcomes: Sequence[TaskOutcome]) -> list[TaskOutcome]:
    """The tasks the tallies count: finished ones (a budget-stopped task is unfinished)."""
    return [o for o in outcomes if o.status != BUDGET]


def _tallies(ev: RunEvidence, outcomes: Sequence[TaskOutcome]) -> dict[str, Any]:
    finished = counted(outcomes)
    tally = score_tally(finished)
    by_level: dict[str, list[TaskOutcome]] = {}
    for o in finished:
        by_level.setdefault(str(o.level), []).append(o)
    statuses = Counter(o.status for o in outcomes)
    return {
        "tasks": len(ev.tasks),
        "finished": len(finished),
        "completed": statuses[COMPLETED],
        "failed": statuses[FAILED],
        "limited": statuses[LIMIT],
        "unfinished": len(ev.tasks) - len(finished),
        "correct": tally["correct"],
        "scored": tally["scored"],
        "unscored": tally["unscored"],
        "by_level": {level: score_tally(group) for level, group in sorted(by_level.items())},
        "turns": sum(o.turns for o in outcomes),
        "tool_calls": sum(o.tool_calls for o in outcomes),
        "bad_tool_calls": sum(o.bad_tool_calls for o in outcomes),
        "usage": sum((o.usage for o in outcomes), Usage()).to_dict(),
        "accuracy": tally["accuracy"],
    }


E = TypeVar("E", bound=Enum)


def saved_choice(kind: type[E], value: Any) -> E:
    """An enum setting as a saved config holds it: by name (``WILSON``, as Hydra writes a structured config's
    enum) or by value (``wilson``), in any case."""
    wanted = str(value).lower()
    for member in kind:
        if wanted in (member.name.lower(), str(member.value).lower()):
            return member
    raise ValueError(f"{value!r} is not one of {', '.join(str(m.value) for m in kind)}")


def stats_settings(ev: RunEvidence) -> StatsSettings:
    """The statistics' settings the run ran with (its saved config's ``stats``)."""
    cfg = ev.cfg
    return StatsSettings(
        interval=saved_choice(IntervalMethod, cfg.stats.interval),
        cluster_by=cfg.stats.cluster_by or None,
        resamples=int(cfg.stats.resamples),
        seed=int(cfg.stats.seed),
    )


def _stats(ev: RunEvidence, outcomes: Sequence[TaskOutcome]) -> dict[str, Any]:
    cfg = ev.cfg
    settings = stats_settings(ev)
    # The verdicts were recomputed with the replay rule already (a replay that parted from the saved run has
    # none): the statistics take them as they are, so a rule of their own cannot drop a scored task.
    scored = [dataclasses.replace(o, replay=None) for o in counted(outcomes)]
    return run_stats(
        scored,
        ev.tasks,
        epochs=ev.epochs,
        reducer=saved_choice(Reducer, cfg.experiment.epoch_reducer),
        settings=settings,
        breakdown=list(cfg.dataset.get("breakdown") or []),
    )


def check_totals(ev: RunEvidence, outcomes: Sequence[TaskOutcome], audit: Audit) -> None:
    """The summary's tallies, statistics and replay accounting against the recomputed outcomes."""
    # Compared leaf by leaf under the names the recomputed figures have: the summary as it was written.
    summary = ev.summary.to_dict()
    expected = _tallies(ev, outcomes)
    replay = replay_summary([(o.replay, o.correct) for o in counted(outcomes)])
    if replay is not None:
        saved_replay = ev.summary.replay.to_dict() if ev.summary.replay is not None else None
        check_leaves(audit, SUMMARY, "replay", saved_replay, replay)
        # A replay's headline is its scored accuracy: recounted here from the tasks' verdicts (the tally), not
        # only recomputed by the function that made it, which once counted tasks with no ground truth.
        stated = None if saved_replay is None else saved_replay.get("accuracy_scored")
        audit.check(SUMMARY, "replay.accuracy_scored", stated, expected["accuracy"], TALLY)
    for key, value in expected.items():
        if key in ("by_level", "usage"):
            check_leaves(audit, SUMMARY, key, summary.get(key), value)
        else:
            audit.check(SUMMARY, key, summary.get(key), value, TALLY)
    if ev.summary.stats is not None:
        saved_stats = ev.summary.stats.to_dict()
        recomputed = _stats(ev, outcomes)
        if not same(saved_stats, recomputed):
            check_leaves(audit, SUMMARY, "stats", saved_stats, recomputed)
        else:
            audit.compared += 1
