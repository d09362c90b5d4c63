"""A run's ``summary.json`` built from its task outcomes: counts, accuracy overall and by level, tool calls,
repairs, tokens, cost and time (a replay's headline says what it billed and what its accuracy is over)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from flowllm.core.types import Usage
from flowllm.run.infra import infra_tool_failures
from flowllm.run.outcome import BUDGET, COMPLETED, FAILED, LIMIT, TaskOutcome
from flowllm.run.replay_audit import replay_summary
from flowllm.rundir.results import CostBlock, InfraFailures, LevelTally, ReplayBlock, RunSummary
from flowllm.scoring.tally import ACCURACY_OF, finished, score_tally
from flowllm.spend.pricing import PriceTable, cost_summary, uncached_input


def summarize(
    outcomes: list[TaskOutcome],
    *,
    total: int,
    wall_seconds: float,
    interrupted: bool,
    resumed: int = 0,
    model: str | None = None,
    prices: PriceTable | None = None,
    attempts: int = 1,
) -> RunSummary:
    """The run's ``summary.json``: accuracy overall and by level, tool calls, repairs, tokens, cost, time.

    Accuracy, overall and by level, is over the scored tasks: those that finished (completed, or failed: a
    wrong answer) and have a ground truth. ``scored`` and ``unscored`` say how many; unfinished tasks (an
    interrupted run) count in neither. None when no task could be scored: not known, never 0."""
    completed = [o for o in outcomes if o.status == COMPLETED]
    tally = score_tally(outcomes)  # unfinished (budget-stopped) tasks are counted in neither scored nor unscored
    usage = sum((o.usage for o in outcomes), Usage())
    repairs: Counter[str] = Counter()
    by_level: dict[str, list[TaskOutcome]] = {}
    for o in outcomes:
        repairs.update(o.repairs)
    for o in finished(outcomes):
        by_level.setdefault(str(o.level), []).append(o)
    calls = sum(o.tool_calls for o in outcomes)
    bad = sum(o.bad_tool_calls for o in outcomes)
    # Made: every tool call the model wrote, malformed blocks included. Parsed: those whose arguments became a
    # dict (at whichever repair stage). The parse rate is their ratio.
    made = calls + bad
    parsed = calls - repairs.get("failed", 0)
    cost = cost_summary(usage, model, prices)
    replay = replay_summary([(o.replay, o.correct) for o in finished(outcomes)])
    cost, accuracy, accuracy_of = _headline(cost, replay, tally["accuracy"])
    return RunSummary(
        tasks=total,
        finished=sum(1 for o in outcomes if o.status != BUDGET),
        completed=len(completed),
        failed=sum(1 for o in outcomes if o.status == FAILED),
        # Ended by a per-task limit (finished, scored on their answer), counted per limit.
        limited=sum(1 for o in outcomes if o.status == LIMIT),
        limits=dict(sorted(Counter(str(o.limit) for o in outcomes if o.status == LIMIT).items())),
        unfinished=total - sum(1 for o in outcomes if o.status != BUDGET),
        resumed=resumed,
        resumed_tasks=sum(1 for o in outcomes if o.resumed_turns),
        resumed_turns=sum(o.resumed_turns for o in outcomes),
        correct=tally["correct"],
        scored=tally["scored"],
        unscored=tally["unscored"],
        accuracy=accuracy,
        accuracy_of=accuracy_of,
        by_level={level: LevelTally.from_dict(score_tally(group)) for level, group in sorted(by_level.items())},
        attempts=attempts,
        attempts_used=sum(o.attempts for o in outcomes),
        turns=sum(o.turns for o in outcomes),
        tool_calls=calls,
        bad_tool_calls=bad,
        failed_tool_calls=sum(o.failed_tool_calls for o in outcomes),
        infra_tool_failures=InfraFailures.from_dict(infra_tool_failures(outcomes)["infra_tool_failures"]),
        tool_calls_made=made,
        tool_calls_parsed=parsed,
        parse_rate=round(parsed / made, 4) if made else None,
        repairs=dict(sorted(repairs.items())),
        usage=usage.to_dict(),
        tokens=_tokens(usage),
        cost=CostBlock.from_dict(cost),
        cost_usd=cost["total_usd"],
        wall_seconds=round(wall_seconds, 3),
        interrupted=interrupted,
        replay=None if replay is None else ReplayBlock.from_dict(replay),
    )


def _headline(
    cost: dict[str, Any], replay: dict[str, Any] | None, accuracy: float | None
) -> tuple[dict[str, Any], float | None, str]:
    """The cost, accuracy and what the accuracy is of. A replay's tokens are the saved run's, served again:
    nothing was spent to get them (a fork's live calls are billed in usage.jsonl; fork_accounting puts them
    here), and its accuracy is over the tasks that replayed."""
    if replay is None:
        return cost, accuracy, ACCURACY_OF
    saved = cost["total_usd"]
    note = "this run billed no replayed call; saved_run_usd: what the saved run paid for these answers"
    cost = {**cost, "total_usd": 0.0, "replayed": True, "saved_run_usd": saved, "note": note}
    accuracy_of = ACCURACY_OF
    if replay["effect_not_known"]:  # the headline figure leaves out the tasks that did not replay: say so
        accuracy_of = f"{ACCURACY_OF}; {replay['effect_not_known']}"
    return cost, replay["accuracy_scored"], accuracy_of


def _tokens(usage: Usage) -> dict[str, int]:
    return {
        "input_uncached": uncached_input(usage),
        "cache_read": usage.cache_read_tokens,
        "cache_write": usage.cache_write_tokens,
        "output": usage.output_tokens,
        "reasoning": usage.reasoning_tokens,
        "total": usage.total_tokens,
    }
