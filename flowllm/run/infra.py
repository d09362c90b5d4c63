"""Tool calls that failed for an infrastructure reason, counted apart from the model's bad calls.

A tool call can fail because the model called it badly (unknown tool, wrong arguments, code that raises) or
because the machinery under it failed: a server that is unavailable, crashed or cannot be reached, a protocol
error, a sandbox that could not be set up (``flowllm.core.types.InfraCause``, set by the tool pool). The second
kind says nothing about the model, so ``summary.json`` → ``infra_tool_failures`` counts it by cause and names
the tasks it hurt, each ``result.json`` carries its own count, and the run's summary table says so at the end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Protocol

from flowllm.rundir.results import InfraFailures


class _HasCauses(Protocol):
    task_id: str
    infra_tool_failure_causes: dict[str, int]


def infra_tool_failures(outcomes: Iterable[_HasCauses]) -> dict[str, Any]:
    """``summary.json`` → ``infra_tool_failures``: total, by cause, and the tasks hurt."""
    causes: Counter[str] = Counter()
    tasks: list[str] = []
    for outcome in outcomes:
        if any(outcome.infra_tool_failure_causes.values()):
            tasks.append(outcome.task_id)
            causes.update(outcome.infra_tool_failure_causes)
    return {
        "infra_tool_failures": {
            "total": sum(causes.values()),
            "by_cause": dict(sorted(causes.items())),
            "tasks": tasks,
        }
    }


def infra_row(block: InfraFailures | None) -> str | None:
    """The summary table's line for them (None when there were none, or an older summary lacks the count)."""
    if block is None or not block.total:
        return None
    causes = ", ".join(f"{cause} {n}" for cause, n in block.by_cause.items())
    return f"{block.total} ({causes}) in {len(block.tasks)} task(s): infrastructure, not the model"
