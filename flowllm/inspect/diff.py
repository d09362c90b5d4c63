"""Comparing two runs task by task: what changed in the results, and the first node where the runs part.

The first divergence is searched turn by turn, node by node (in pipeline order), input before output, with
values that differ between any two live runs ignored (server ids, clocks: ``jsondiff.VOLATILE_KEYS``). For a
replay with another repair chain it lands on the node that changed (``repair_arguments``' output); for two live
runs of a model, on the first reply that differs.

When either run is a replay, each task carries both sides' replay verdicts (flowllm/run/replay_audit.py):
a task whose verdict is not the same in two replays is flagged, and a task that diverged or missed a turn is
listed even when its result is the same, since its answer came from replies to another conversation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from flowllm.inspect.artifacts import Artifact, NodeRecord, RunRecord, TaskRecord, summary_figures
from flowllm.inspect.replay import replay_counts, replay_label, replay_verdict
from flowllm.inspect.views import CallView, task_turn_views
from flowllm.rundir.jsondiff import VOLATILE_KEYS, first_difference, short
from flowllm.rundir.layout import EPOCHS_DIR, INPUT_FILE, MAIN_AGENT, META_FILE, OUTPUT_FILE
from flowllm.rundir.results import RunSummary, TaskResult
from flowllm.scoring.tally import is_finished, judging_failed

T = TypeVar("T")

# result.json fields compared, in the order changes are reported (status as the task reads: unfinished...).
RESULT_FIELDS: dict[str, Callable[[TaskResult], Any]] = {
    "status": lambda r: r.status,
    "correct": lambda r: _verdict(r),
    "answer": lambda r: r.answer,
    "turns": lambda r: r.turns,
    "stop": lambda r: r.stop,
    "tool_calls": lambda r: r.tool_calls,
    "bad_tool_calls": lambda r: r.bad_tool_calls,
    "failed_tool_calls": lambda r: r.failed_tool_calls,
    "repairs": lambda r: r.repairs,
    "error": lambda r: r.error,
}


def _verdict(result: TaskResult) -> bool | str | None:
    """``correct`` as the tallies count it: a task the run's budget stopped is unfinished and one whose answer
    could not be scored is unscored, whatever its ``correct`` field says (false, for both)."""
    if not is_finished(result.status):
        return "unfinished"
    if judging_failed(result):
        return "unscored"
    return result.correct


SUMMARY_FIELDS: dict[str, Callable[[RunSummary], Any]] = {
    "accuracy": lambda s: s.accuracy,
    "correct": lambda s: s.correct,
    "scored": lambda s: s.scored,
    "unfinished": lambda s: s.unfinished,
    "completed": lambda s: s.completed,
    "failed": lambda s: s.failed,
    "turns": lambda s: s.turns,
    "tool_calls": lambda s: s.tool_calls,
    "bad_tool_calls": lambda s: s.bad_tool_calls,
    "failed_tool_calls": lambda s: s.failed_tool_calls,
    "parse_rate": lambda s: s.parse_rate,
    "repairs": lambda s: s.repairs,
}


@dataclass
class Divergence:
    """Where two tasks' artifacts first differ."""

    turn: int | None
    agent: str
    node: str | None
    file: str | None
    detail: str

    def describe(self) -> str:
        where = []
        if self.agent != "main":
            where.append(f"agent {self.agent}")
        if self.turn is not None:
            where.append(f"turn {self.turn}")
        if self.node:
            where.append(self.node)
        if self.file:
            where.append(self.file)
        return f"{' / '.join(where)}: {self.detail}" if where else self.detail


@dataclass
class TaskDiff:
    task_id: str
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    call_changes: list[str] = field(default_factory=list)
    divergence: Divergence | None = None
    only_in: str | None = None  # "A" or "B" when the task is in one run only
    # When either run is a replay: each side's verdict (None for a side that is not a replay).
    replay: tuple[dict[str, Any] | None, dict[str, Any] | None] | None = None

    @property
    def replay_differs(self) -> bool:
        """Both runs are replays and the task replayed otherwise in each (exact in one, diverged in the other...)."""
        if self.replay is None or None in self.replay:
            return False
        return replay_label(self.replay[0]) != replay_label(self.replay[1])

    @property
    def replay_off(self) -> bool:
        """A side did not replay: its answer came from replies to another conversation, even if it is the same."""
        return self.replay is not None and any(
            v is not None and v.get("status") in ("diverged", "missing") for v in self.replay
        )

    @property
    def differs(self) -> bool:
        return bool(self.changes or self.call_changes or self.only_in or self.replay_differs or self.replay_off)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["changes"] = {k: {"a": a, "b": b} for k, (a, b) in self.changes.items()}
        data["divergence"] = self.divergence.describe() if self.divergence else None
        if self.replay is None:
            del data["replay"]
        else:
            data["replay"] = {"a": self.replay[0], "b": self.replay[1], "differs": self.replay_differs}
        return data


@dataclass
class RunDiff:
    a: Path
    b: Path
    tasks: list[TaskDiff]
    unchanged: list[str]
    summary_changes: dict[str, tuple[Any, Any]]
    settings_changes: dict[str, tuple[Any, Any]]
    # Each side's replay counts (views.replay_counts) when either run is a replay; None otherwise.
    replay: tuple[dict[str, Any] | None, dict[str, Any] | None] | None = None

    @property
    def replay_differs(self) -> list[str]:
        """The tasks whose replay verdict is not the same in both runs."""
        return [t.task_id for t in self.tasks if t.replay_differs]

    def to_dict(self) -> dict[str, Any]:
        data = {
            "a": str(self.a),
            "b": str(self.b),
            "settings": {k: {"a": a, "b": b} for k, (a, b) in self.settings_changes.items()},
            "summary": {k: {"a": a, "b": b} for k, (a, b) in self.summary_changes.items()},
            "tasks": [t.to_dict() for t in self.tasks],
            "unchanged": self.unchanged,
        }
        if self.replay is not None:
            data["replay"] = {"a": self.replay[0], "b": self.replay[1], "verdict_differs": self.replay_differs}
        return data


def _value(artifact: Artifact) -> Any:
    if artifact.ok:
        return artifact.value
    return None if artifact.missing else f"<unreadable: {artifact.error}>"


def _call_signature(call: CallView) -> str:
    stage = f"failed: {call.repair_error}" if call.repair_error else (call.repair_stage or "none")
    outcome = "tool error" if call.result_error else "ok"
    return f"{call.label} [repair: {stage}, {outcome}]"


def _conversation(agent: str, as_epochs: bool) -> str:
    """A conversation's name as a run with epochs has it: a task run once (``experiment.epochs=1``) is its epoch
    1 beside a task run over epochs, so their first epochs are compared."""
    if not as_epochs or agent.startswith(f"{EPOCHS_DIR}/"):
        return agent
    return f"{EPOCHS_DIR}/1" if agent == MAIN_AGENT else f"{EPOCHS_DIR}/1/{agent}"


def _keyed(task: TaskRecord, other: TaskRecord, items: Iterable[tuple[str, int, T]]) -> dict[tuple[str, int], T]:
    """``items`` (agent, turn number, value) keyed by conversation and turn, named as in ``other``'s run."""
    as_epochs = bool(other.epochs) and not task.epochs
    return {(_conversation(agent, as_epochs), number): value for agent, number, value in items}


def _order(key: tuple[str, int]) -> tuple[bool, list[tuple[int, int | str]], int]:
    """The main conversation first, then the others by name, numbers as numbers (epochs/2 before epochs/10)."""
    parts: list[tuple[int, int | str]] = [(0, int(p)) if p.isdigit() else (1, p) for p in key[0].split("/")]
    return key[0] != MAIN_AGENT, parts, key[1]


def compare_calls(a: TaskRecord, b: TaskRecord) -> list[str]:
    """The tool calls that differ, turn by turn, in words."""
    calls_a = _keyed(a, b, ((v.agent, v.number, v.calls) for v in task_turn_views(a)))
    calls_b = _keyed(b, a, ((v.agent, v.number, v.calls) for v in task_turn_views(b)))
    changes: list[str] = []
    for key in sorted(set(calls_a) | set(calls_b), key=_order):
        agent, number = key
        where = f"turn {number}" + (f" (agent {agent})" if agent != "main" else "")
        left, right = calls_a.get(key), calls_b.get(key)
        if left is None or right is None:
            present = "A" if right is None else "B"
            calls = left if right is None else right
            if calls:
                changes.append(f"{where}: only in {present}: {', '.join(_call_signature(c) for c in calls or [])}")
            continue
        for i in range(max(len(left), len(right))):
            ca = left[i] if i < len(left) else None
            cb = right[i] if i < len(right) else None
            if ca is None or cb is None:
                only = cb if ca is None else ca
                assert only is not None
                changes.append(f"{where}: call {i + 1} only in {'B' if ca is None else 'A'}: {_call_signature(only)}")
                continue
            sa, sb = _call_signature(ca), _call_signature(cb)
            if sa != sb or ca.arguments != cb.arguments:
                if sa != sb:
                    detail = f"{sa} -> {sb}"
                else:
                    detail = f"{sa}: arguments {short(ca.arguments, 80)} -> {short(cb.arguments, 80)}"
                changes.append(f"{where}: call {i + 1}: {detail}")
    return changes


def _nodes_by_folder(nodes: list[NodeRecord]) -> dict[str, NodeRecord]:
    return {n.folder: n for n in nodes}


def first_divergence(a: TaskRecord, b: TaskRecord) -> Divergence | None:
    turns_a = _keyed(a, b, ((agent, t.number, t) for agent, t in a.all_turns()))
    turns_b = _keyed(b, a, ((agent, t.number, t) for agent, t in b.all_turns()))
    for key in sorted(set(turns_a) | set(turns_b), key=_order):
        agent, number = key
        ta, tb = turns_a.get(key), turns_b.get(key)
        if ta is None or tb is None:
            return Divergence(number, agent, None, None, f"this turn exists only in {'A' if tb is None else 'B'}")
        nodes_a, nodes_b = _nodes_by_folder(ta.nodes), _nodes_by_folder(tb.nodes)
        order = [n.folder for n in ta.nodes] + [f for f in (n.folder for n in tb.nodes) if f not in nodes_a]
        for folder in order:
            na, nb = nodes_a.get(folder), nodes_b.get(folder)
            if na is None or nb is None:
                return Divergence(number, agent, folder, None, f"this node exists only in {'A' if nb is None else 'B'}")
            for name, reader in ((INPUT_FILE, NodeRecord.input), (OUTPUT_FILE, NodeRecord.output)):
                diff = first_difference(_value(reader(na)), _value(reader(nb)), VOLATILE_KEYS)
                if diff is not None:
                    return Divergence(number, agent, folder, name, diff.describe(160))
            if na.status != nb.status:
                return Divergence(number, agent, folder, META_FILE, f"status {na.status} vs {nb.status}")
    return None


def diff_tasks(a: TaskRecord, b: TaskRecord, replay: bool = False) -> TaskDiff:
    result = TaskDiff(a.task_id)
    if replay:
        result.replay = (replay_verdict(a), replay_verdict(b))
    for name, read in RESULT_FIELDS.items():
        va = None if a.result_record is None else read(a.result_record)
        vb = None if b.result_record is None else read(b.result_record)
        if name == "status":
            va, vb = a.status, b.status
        if va != vb:
            result.changes[name] = (va, vb)
    result.call_changes = compare_calls(a, b)
    if result.differs:
        result.divergence = first_divergence(a, b)
    return result


def _settings(run: RunRecord) -> dict[str, Any]:
    keys = (
        "provider.name",
        "provider.model",
        "provider.protocol",
        "runner.name",
        "repair.name",
        "pipeline.name",
        "tools.name",
        "agent.max_turns",
        "experiment.name",
        "experiment.epochs",
        "experiment.epoch_reducer",
        "experiment.attempts",
        # What stops tasks: a difference here explains tasks unfinished or ended in one run only.
        "experiment.budget.cost_usd",
        "experiment.budget.tokens",
        "agent.limits.cost_usd",
        "agent.limits.tokens",
        "agent.limits.turns",
        "agent.limits.wall_s",
        "judge.provider",
    )
    return {k: run.setting(k) for k in keys}


def diff_runs(a: RunRecord, b: RunRecord) -> RunDiff:
    by_id_b = {t.task_id: t for t in b.tasks}
    ids_a = {t.task_id for t in a.tasks}
    counts = (replay_counts(a), replay_counts(b))
    replay = counts != (None, None)
    tasks: list[TaskDiff] = []
    unchanged: list[str] = []
    for task in a.tasks:
        other = by_id_b.get(task.task_id)
        if other is None:
            tasks.append(TaskDiff(task.task_id, only_in="A", replay=(replay_verdict(task), None) if replay else None))
            continue
        d = diff_tasks(task, other, replay)
        (tasks.append(d) if d.differs else unchanged.append(task.task_id))
    tasks.extend(
        TaskDiff(t.task_id, only_in="B", replay=(None, replay_verdict(t)) if replay else None)
        for t in b.tasks
        if t.task_id not in ids_a
    )
    sa, sb = summary_figures(a), summary_figures(b)
    summary_changes = {k: (read(sa), read(sb)) for k, read in SUMMARY_FIELDS.items() if read(sa) != read(sb)}
    set_a, set_b = _settings(a), _settings(b)
    settings_changes = {k: (set_a[k], set_b[k]) for k in set_a if set_a[k] != set_b[k]}
    return RunDiff(a.path, b.path, tasks, unchanged, summary_changes, settings_changes, counts if replay else None)
