"""GAIA's leaderboard submission file: one JSON line per task of the split.

The leaderboard documents it as ``{"task_id": ..., "model_answer": ..., "reasoning_trace": ...}`` per line,
the first two mandatory, and it scores a file only when every task of the split is there. So every task of
the run's dataset (the whole split: the run's ``limit``, ``levels`` and ``task_ids`` selection is not applied)
gets a line; a task without an answer (not run, failed, unfinished) gets ``""`` and is listed in ``missing``.

A task run over epochs (``experiment.epochs`` > 1) still gets one line, once all its epochs have run: the
answer its epochs gave most often (compared normalised, as ``epoch_reducer=majority`` votes; empty answers do
not vote; a tie goes to the earliest epoch), as the first epoch that gave it wrote it, with that epoch's
reasoning trace. The reducers score the epochs; none of them picks an answer, so the vote is the same whatever
``experiment.epoch_reducer`` says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson

from flowllm.datasets.adapters import DatasetSpec, load_dataset
from flowllm.datasets.task import DatasetError
from flowllm.export.source import RunSource, write_atomically
from flowllm.export.trace import TaskTrace
from flowllm.resources import bundled
from flowllm.scoring.stats import voted_epoch

TRACE_RESULT_CHARS = 500  # a tool result's text kept in the reasoning trace


@dataclass(frozen=True)
class SubmissionLine:
    task_id: str
    model_answer: str
    reasoning_trace: str

    def to_json(self) -> bytes:
        return orjson.dumps(
            {"task_id": self.task_id, "model_answer": self.model_answer, "reasoning_trace": self.reasoning_trace}
        )


@dataclass
class Submission:
    lines: list[SubmissionLine]
    missing: list[str]  # tasks of the split with an empty answer
    split: str  # where the task list came from
    notes: list[str] = field(default_factory=list)


def reasoning_trace(trace: TaskTrace) -> str:
    """The main agent's turns as text: what the model said, the tools it called and what they returned."""
    parts: list[str] = []
    for turn in trace.conversation.turns:
        if turn.model is not None and turn.model.text.strip():
            parts.append(f"[turn {turn.number}] {turn.model.text.strip()}")
        for call in turn.tool_calls:
            label = f"{call.server}.{call.name}" if call.server else call.name
            if call.error and call.arguments is None:
                parts.append(f"[tool {label}] not run: {call.error}")
            elif call.result is not None:
                result = (
                    call.result if len(call.result) <= TRACE_RESULT_CHARS else call.result[:TRACE_RESULT_CHARS] + "…"
                )
                parts.append(f"[tool {label}{' error' if call.is_error else ''}] {result}")
    return "\n".join(parts)


def _split_ids(source: RunSource) -> tuple[list[str] | None, str]:
    """The ids of every task of the run's dataset, in file order, or None (and why) when it cannot be read."""
    dataset = source.setting("dataset")
    if not isinstance(dataset, dict) or not dataset.get("path"):
        return None, "the run's dataset is not known (no .hydra/config.yaml)"
    whole = {**dataset, "limit": None, "levels": None, "task_ids": None}
    path = bundled(str(dataset["path"]))
    try:
        tasks = load_dataset(DatasetSpec.from_config(whole, path))
    except DatasetError as exc:
        return None, f"the dataset cannot be read here ({exc})"
    return [t.task_id for t in tasks], str(path)


def submitted_trace(runs: list[TaskTrace]) -> TaskTrace | None:
    """The run of a task whose answer is submitted: the task's own, or its voted epoch (None: not finished)."""
    if not runs[0].epoch_folder:
        return runs[0] if runs[0].finished else None
    if runs[0].task_result is None:
        return None  # not every epoch has run: the task is unfinished
    done = [t for t in runs if t.finished]
    chosen = voted_epoch([str(t.saved.answer or "") for t in done])
    return done[chosen] if chosen is not None else (done[-1] if done else None)


def build_submission(source: RunSource) -> Submission:
    runs: dict[str, list[TaskTrace]] = {}
    for run in source.traces:
        runs.setdefault(run.task_id, []).append(run)
    by_id = {task_id: chosen for task_id, traces in runs.items() if (chosen := submitted_trace(traces)) is not None}
    ids, split = _split_ids(source)
    notes: list[str] = []
    if ids is None:
        notes.append(f"{split}: the file lists the run's own tasks only, and GAIA wants every task of the split")
        ids = list(runs)
        split = "the run's tasks"
    extra = [t for t in by_id if t not in set(ids)]
    if extra:
        notes.append(f"{len(extra)} task(s) of the run are not in the split and are left out: {', '.join(extra)}")
    lines: list[SubmissionLine] = []
    missing: list[str] = []
    for task_id in ids:
        trace = by_id.get(task_id)
        answer = trace.saved.answer if trace is not None else None
        text = "" if answer is None else str(answer)
        if not text:
            missing.append(task_id)
        lines.append(SubmissionLine(task_id, text, reasoning_trace(trace) if trace is not None else ""))
    return Submission(lines, missing, split, notes)


def write_submission(submission: Submission, path: Path) -> None:
    data = b"".join(line.to_json() + b"\n" for line in submission.lines)
    write_atomically(path, lambda tmp: tmp.write_bytes(data))
