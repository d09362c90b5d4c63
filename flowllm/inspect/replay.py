"""A replay's verdicts as the inspect commands and the report show them: per task, counted over the run, and at a
divergence what the node produced in the saved run and in this one (provider=replay runs, flowllm/run/replay_audit.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flowllm.inspect.artifacts import MAIN_AGENT, RunRecord, TaskRecord, read_artifact, summary_figures
from flowllm.run.replay_audit import ReplayStatus, judged, replay_summary
from flowllm.rundir.jsondiff import first_difference
from flowllm.rundir.layout import EPOCHS_DIR, OUTPUT_FILE
from flowllm.rundir.results import ForkBlock, ReplayBlock

# What result.json says under ``replay`` in a provider=replay run (flowllm/run/replay_audit.py).
REPLAY_STATUSES = tuple(s.value for s in ReplayStatus)
# How much of a saved or a new value the divergence detail keeps (the rest: the node command).
DETAIL_CHARS = 2000
STRING_CONTEXT = 80  # two strings that differ are shown from this many characters before the first difference


def replay_verdict(task: TaskRecord) -> dict[str, Any] | None:
    """The task's replay verdict, or None when the run was not a replay (or the task never finished)."""
    value = task.record.replay
    if not isinstance(value, dict) or value.get("status") not in REPLAY_STATUSES:
        return None
    return value


def replay_where(verdict: dict[str, Any]) -> str:
    """Where a replay diverged: ``turn 1 / repair_arguments`` (a sub-agent's conversation is named first)."""
    parts = []
    if verdict.get("scope"):
        parts.append(f"agent {verdict['scope']}")
    if verdict.get("turn") is not None:
        parts.append(f"turn {verdict['turn']}")
    if verdict.get("node"):
        parts.append(str(verdict["node"]))
    return " / ".join(parts)


def replay_label(verdict: dict[str, Any] | None) -> str:
    """One cell: exact, diverged at turn N / node, forked at turn N (turn M / node), missing, unverified; ``-``
    when there is no verdict."""
    if verdict is None:
        return "-"
    status = str(verdict["status"])
    if status == ReplayStatus.FORKED.value:
        divergence = verdict.get("divergence")
        cause = f" ({replay_where(divergence)})" if isinstance(divergence, dict) else ""
        if verdict.get("turn") is None:
            return f"forked: no live call needed{cause}"
        return f"forked at turn {verdict['turn']}{cause}"
    where = replay_where(verdict) if status == ReplayStatus.DIVERGED.value else ""
    return f"{status} at {where}" if where else status


def is_replay(run: RunRecord) -> bool:
    """Whether the run was a replay (provider=replay): its summary or any of its tasks carries a verdict."""
    summary = run.summary_record
    return (summary is not None and summary.replay is not None) or any(replay_verdict(t) is not None for t in run.tasks)


def replay_counts(run: RunRecord) -> dict[str, Any] | None:
    """Exact, forked, diverged, missing and unverified task counts, accuracy on the exact replays and on the
    scored (exact and forked) tasks, and a fork's spending; None when the run was not a replay. From
    summary.json, else counted from the tasks' verdicts."""
    if not is_replay(run):
        return None
    summary = summary_figures(run)
    if isinstance(summary.replay, ReplayBlock):
        counts = summary.replay
    else:
        counted = replay_summary([(replay_verdict(t), t.correct) for t in run.tasks if t.result.ok]) or {}
        counts = ReplayBlock.from_dict(counted)
    tasks = summary.tasks or len(run.tasks)
    correct = summary.correct if summary.correct is not None else sum(t.correct is True for t in run.tasks)
    exact = int(counts.exact or 0)
    scored = int(counts.scored if counts.scored is not None else exact)
    scored_correct = int(counts.scored_correct if counts.scored_correct is not None else counts.exact_correct or 0)
    accuracy_scored = counts.accuracy_scored if counts.scored is not None else counts.accuracy_exact
    fork = summary.fork.to_dict() if isinstance(summary.fork, ForkBlock) else None
    exact_judged, scored_judged = judged((replay_verdict(t), t.correct) for t in run.tasks)
    statuses = {
        ReplayStatus.EXACT: counts.exact,
        ReplayStatus.DIVERGED: counts.diverged,
        ReplayStatus.MISSING: counts.missing,
        ReplayStatus.UNVERIFIED: counts.unverified,
        ReplayStatus.FORKED: counts.forked,
    }
    return {
        **{s.value: int(n or 0) for s, n in statuses.items()},
        "exact_correct": int(counts.exact_correct or 0),
        "accuracy_exact": counts.accuracy_exact,
        "scored": scored,
        "unscored": int((counts.unscored if counts.scored is not None else tasks - scored) or 0),
        "scored_correct": scored_correct,
        "accuracy_scored": accuracy_scored,
        # The denominators of the two accuracies: the tasks among them with a verdict (not those with no truth).
        "exact_judged": exact_judged,
        "scored_judged": scored_judged,
        "correct": correct,
        "tasks": tasks,
        "fork": fork,
    }


@dataclass
class ReplayDetail:
    """A task's replay verdict, and at a divergence what the node produced in the saved run and in this one."""

    status: str
    label: str
    turn: int | None = None
    agent: str = MAIN_AGENT
    node: str | None = None
    folder: str | None = None  # the node's artifact folder in this run (06_repair_arguments)
    what: str | None = None  # the audit's description of the first difference
    path: str | None = None  # where in the node's output the values differ (prepared_calls[0].arguments)
    offset: int | None = None  # two strings: the first character that differs (both are shown from near it)
    saved: Any = None  # the value at ``path`` in the saved run's output.json
    new: Any = None  # ... and in this run's
    saved_run: str | None = None  # the replayed run (provider.run_dir)
    note: str | None = None  # why saved and new are not shown, when they are not

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cut(value: Any) -> Any:
    """A value short enough to show: long strings cut, with how much was left out."""
    if isinstance(value, str) and len(value) > DETAIL_CHARS:
        return value[:DETAIL_CHARS] + f"... [{len(value) - DETAIL_CHARS} more characters]"
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value


def replay_detail(run: RunRecord, task: TaskRecord) -> ReplayDetail | None:
    """The task's replay verdict with what changed at the divergence (None when the run was not a replay).

    The audit keeps a short description; the saved and new values themselves are read back from the node's
    ``output.json`` in the replayed run (``provider.run_dir``) and in this one, when both are still there.
    """
    verdict = replay_verdict(task)
    if verdict is None:
        return None
    detail = ReplayDetail(status=str(verdict["status"]), label=replay_label(verdict))
    if detail.status != ReplayStatus.DIVERGED.value:
        return detail
    detail.turn = verdict.get("turn") if isinstance(verdict.get("turn"), int) else None
    detail.agent = str(verdict.get("scope") or MAIN_AGENT)
    epoch = verdict.get("epoch")  # a task run over epochs: the first epoch that did not replay exactly
    if isinstance(epoch, int):
        inside = "" if detail.agent == MAIN_AGENT else f"/{detail.agent}"
        detail.agent = f"{EPOCHS_DIR}/{epoch}{inside}"
    detail.node = str(verdict.get("node") or "") or None
    detail.what = str(verdict.get("what") or "") or None
    source = run.setting("provider.run_dir")
    detail.saved_run = str(source) if source else None
    record = None
    with contextlib.suppress(KeyError):  # a sub-agent this run kept no folder for
        record = task.turn(detail.turn, detail.agent) if detail.turn is not None else None
    node = next((n for n in record.nodes if n.name == detail.node), None) if record is not None else None
    if node is None:
        detail.note = "this run kept no record of that node (recorder.snapshot)"
        return detail
    detail.folder = node.folder
    if not source:
        detail.note = "the run's config does not name the replayed run (provider.run_dir)"
        return detail
    saved = read_artifact(Path(str(source)).expanduser() / node.path.relative_to(run.path) / OUTPUT_FILE)
    new = node.output()
    if not saved.ok or not new.ok:
        detail.note = f"the saved run's output.json cannot be read: {saved.error}" if not saved.ok else new.error
        return detail
    diff = first_difference(saved.value, new.value)
    if diff is None:  # the audit compared the bytes: same JSON, written otherwise
        detail.note = "the two outputs hold the same values, written differently"
        return detail
    detail.path = diff.path or "(the whole output)"
    left, right = diff.left, diff.right
    if isinstance(left, str) and isinstance(right, str):
        common = next((i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b), None)
        detail.offset = min(len(left), len(right)) if common is None else common
        start = max(0, detail.offset - STRING_CONTEXT)
        if start:  # what comes before is the same on both sides
            left, right = "..." + left[start:], "..." + right[start:]
    detail.saved, detail.new = _cut(left), _cut(right)
    if diff.missing:
        detail.note = f"only in the {'saved run' if diff.missing == 'right' else 'new run'}"
    return detail
