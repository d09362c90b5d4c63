"""Tool calls failed by the infrastructure are counted apart: per task in result.json, by cause in summary.json,
and as a line of the summary table."""

from __future__ import annotations

from flowllm.core.types import Usage
from flowllm.run.infra import infra_row
from flowllm.run.outcome import COMPLETED, TaskOutcome, outcome_problems
from flowllm.run.report import summary_rows
from flowllm.run.summary import summarize


def outcome(task_id: str, causes: dict[str, int], failed: int) -> TaskOutcome:
    return TaskOutcome(
        task_id=task_id,
        status=COMPLETED,
        answer="1",
        ground_truth="1",
        correct=True,
        turns=2,
        usage=Usage(),
        tool_calls=3,
        failed_tool_calls=failed,
        infra_tool_failure_causes=causes,
    )


def test_counts_by_cause_and_the_tasks_hurt() -> None:
    outcomes = [
        outcome("a", {"server_lost": 2}, failed=3),
        outcome("b", {}, failed=1),
        outcome("c", {"unavailable": 1, "server_lost": 1}, failed=2),
    ]
    record = summarize(outcomes, total=3, wall_seconds=1.0, interrupted=False)
    summary = record.to_dict()
    assert summary["failed_tool_calls"] == 6  # every failed call, the model's and the infrastructure's
    assert summary["infra_tool_failures"] == {
        "total": 4,
        "by_cause": {"server_lost": 3, "unavailable": 1},
        "tasks": ["a", "c"],
    }
    line = "4 (server_lost 3, unavailable 1) in 2 task(s): infrastructure, not the model"
    assert infra_row(record.infra_tool_failures) == line
    rows = dict(summary_rows(summary))
    assert any("infrastructure, not the model" in value for value in rows.values())
    clean = summarize([outcomes[1]], total=1, wall_seconds=1.0, interrupted=False)
    assert infra_row(clean.infra_tool_failures) is None
    assert not any("infrastructure" in v for v in dict(summary_rows(clean)).values())


def test_result_json_marks_the_task_and_reads_back() -> None:
    data = outcome("a", {"server_lost": 2}, failed=3).to_dict()
    assert data["infra_tool_failures"] == 2 and data["infra_tool_failure_causes"] == {"server_lost": 2}
    assert outcome_problems(data) == []
    assert TaskOutcome.from_dict(data).infra_tool_failure_causes == {"server_lost": 2}
