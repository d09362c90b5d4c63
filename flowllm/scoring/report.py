"""The scoring part of ``summary.json``: scoring errors, the judge's verdicts and its own cost, and accuracy
broken down by the dataset's categories (``dataset.breakdown``: topic, category, answer type...)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from flowllm.scoring.judge import CALL_FAILED, NO_VERDICT, judge_summary
from flowllm.scoring.tally import judging_failed, score_tally


def _accuracy(correct: int, tasks: int) -> float:
    return round(correct / tasks, 4) if tasks else 0.0


def breakdown(outcomes: Sequence[Any], fields: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{field: {value: {tasks, scored, unscored, correct, accuracy}}}`` over the finished tasks, counted as the
    headline is (accuracy over scored tasks, None when none was); a missing value is "None"."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in fields:
        groups: dict[str, list[Any]] = {}
        for o in outcomes:
            groups.setdefault(str((o.categories or {}).get(name)), []).append(o)
        out[name] = {value: score_tally(group) for value, group in sorted(groups.items())}
    return out


def scoring_summary(
    outcomes: Sequence[Any],
    *,
    scorer: str,
    fields: Iterable[str] = (),
    run_dir: Path | None = None,
    judge_provider: str | None = None,
    judge_model: str | None = None,
    template: str | None = None,
) -> dict[str, Any]:
    """What the summary says about scoring. A task whose answer could not be scored (the judge failed) is unscored,
    not wrong: ``scoring_errors`` says how many, and ``accuracy_scored`` is over the completed tasks that were."""
    completed = [o for o in outcomes if o.status == "completed"]
    errors = [o for o in completed if judging_failed(o)]
    judged = [o for o in completed if not judging_failed(o) and o.correct is not None]
    scored = len(judged)
    correct = sum(int(bool(o.correct)) for o in judged)
    result: dict[str, Any] = {
        "scorer": scorer,
        "scoring_errors": len(errors),
        "accuracy_scored": _accuracy(correct, scored) if scored else None,
        "breakdown": breakdown(outcomes, fields),
    }
    if scorer != "judge":
        return result
    kinds = Counter(str((o.judge or {}).get("error_kind")) for o in errors)
    verdicts = Counter(o.verdict for o in completed if o.verdict)
    models = sorted({str((o.judge or {}).get("judge_model")) for o in completed if (o.judge or {}).get("judge_model")})
    ledger = judge_summary(run_dir) if run_dir is not None else None
    result["judge"] = {
        "provider": judge_provider,
        "model": judge_model,
        "models_answered": models,  # a fallback may have answered some calls
        "template": template,
        "verdicts": dict(sorted(verdicts.items())),
        "parse_failures": kinds.get(NO_VERDICT, 0),
        "call_failures": kinds.get(CALL_FAILED, 0),
        "cached": sum(1 for o in completed if (o.judge or {}).get("cached")),
        # From the judge's own ledger (judge_usage.jsonl): every call it made in this folder, resumed runs
        # included; the agent's tokens and cost above do not include these.
        "calls": None if ledger is None else ledger["calls"],
        "calls_failed": None if ledger is None else ledger["calls_failed"],
        "retries": None if ledger is None else ledger["retries"],
        "usage": None if ledger is None else ledger["usage"],
        # Not known when a judge model has no price in the table (unpriced_calls says how many).
        "cost_usd": None if ledger is None or ledger["unpriced_calls"] else ledger["cost_usd"],
        "unpriced_calls": None if ledger is None else ledger["unpriced_calls"],
    }
    return result
