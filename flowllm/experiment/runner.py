"""An experiment: every selected task of a dataset through the agent, concurrently, scored and recorded.

A task that fails (an exception, a timeout) is recorded as failed with its error and never stops the others.
Tasks whose ``result.json`` already says completed are skipped, so rerunning into the same run directory resumes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowllm.agent.loop import Agent, AgentResult
from flowllm.benchmarks.gaia import Task, question_scorer
from flowllm.core.interfaces import Provider
from flowllm.core.types import Usage
from flowllm.engine import Recorder
from flowllm.engine.recorder import read_json
from flowllm.experiment.progress import ProgressReporter
from flowllm.tools import open_tool_pool

log = logging.getLogger(__name__)

COMPLETED = "completed"
FAILED = "failed"


@dataclass
class TaskOutcome:
    task_id: str
    status: str
    answer: str | None
    ground_truth: str | None
    correct: bool
    turns: int
    usage: Usage
    error: str | None = None
    level: int | None = None
    stop: str | None = None
    tool_calls: int = 0
    bad_tool_calls: int = 0
    failed_tool_calls: int = 0
    repairs: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "status": self.status,
            "answer": self.answer,
            "ground_truth": self.ground_truth,
            "correct": self.correct,
            "turns": self.turns,
            "usage": self.usage.to_dict(),
            "error": self.error,
            "level": self.level,
            "stop": self.stop,
            "tool_calls": self.tool_calls,
            "bad_tool_calls": self.bad_tool_calls,
            "failed_tool_calls": self.failed_tool_calls,
            "repairs": dict(sorted(self.repairs.items())),
            "wall_seconds": round(self.wall_seconds, 3),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskOutcome:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["usage"] = Usage.from_dict(data.get("usage"))
        return cls(**known)


def task_prompt(task: Task) -> str:
    prompt = task.question.strip()
    if task.file_name:
        name = Path(task.file_name).name
        kind = Path(name).suffix.lstrip(".").upper() or "file"
        prompt += f"\n\nAttached file ({kind}): `{name}`, in your working directory."
    return prompt


def safe_task_dir_name(task_id: str) -> str:
    if not task_id or task_id in (".", "..") or any(sep in task_id for sep in ("/", "\\", os.sep)):
        raise ValueError(f"task_id {task_id!r} cannot name a folder")
    return task_id


@dataclass
class ExperimentSettings:
    max_concurrent: int = 4
    task_timeout_s: float = 900.0
    resume: bool = True


class Experiment:
    """Runs tasks with one provider, one agent (pipeline + runner) and one tool configuration."""

    def __init__(
        self,
        *,
        agent: Agent,
        provider: Provider,
        tools_cfg: Any,
        recorder: Recorder,
        settings: ExperimentSettings,
        progress: ProgressReporter | None = None,
        open_tools: Callable[..., Any] = open_tool_pool,
    ) -> None:
        self.agent = agent
        self.provider = provider
        self.tools_cfg = tools_cfg
        self.recorder = recorder
        self.settings = settings
        self.progress = progress
        self.open_tools = open_tools

    def previous_outcome(self, task: Task) -> TaskOutcome | None:
        path = self.recorder.task_dir(task.task_id) / "result.json"
        if not (self.settings.resume and path.is_file()):
            return None
        try:
            data = read_json(path)
        except Exception:  # a corrupt result means the task did not finish cleanly: run it again
            return None
        return TaskOutcome.from_dict(data) if data.get("status") == COMPLETED else None

    def _workspace(self, task: Task) -> Path:
        task_dir = self.recorder.task_dir(safe_task_dir_name(task.task_id))
        workspace = task_dir / "workspace"
        # A rerun starts from the attachments again, not from what an interrupted attempt left behind.
        for turn_dir in task_dir.glob("turn_*"):
            shutil.rmtree(turn_dir, ignore_errors=True)
        shutil.rmtree(workspace, ignore_errors=True)
        workspace.mkdir(parents=True)
        if task.attachment is not None:
            if not task.attachment.is_file():
                raise FileNotFoundError(f"attachment '{task.file_name}' is missing from the dataset folder")
            shutil.copy2(task.attachment, workspace / Path(task.file_name or "").name)
        return workspace

    async def run_task(self, task: Task) -> TaskOutcome:
        started = time.perf_counter()
        result: AgentResult | None = None
        error: str | None = None
        try:
            workspace = self._workspace(task)
            async with asyncio.timeout(self.settings.task_timeout_s):
                async with self.open_tools(self.tools_cfg, workspace) as tools:
                    result = await self.agent.run(task.task_id, task_prompt(task), self.provider, tools)
        except TimeoutError:
            error = f"task timed out after {self.settings.task_timeout_s:g}s (experiment.task_timeout_s)"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = _describe(exc)
            log.debug("task %s failed", task.task_id, exc_info=True)
        wall = time.perf_counter() - started
        if result is None:
            outcome = TaskOutcome(
                task_id=task.task_id,
                status=FAILED,
                answer=None,
                ground_truth=task.ground_truth,
                correct=False,
                turns=0,
                usage=Usage(),
                error=error,
                level=task.level,
                wall_seconds=wall,
            )
        else:
            outcome = TaskOutcome(
                task_id=task.task_id,
                status=COMPLETED,
                answer=result.answer,
                ground_truth=task.ground_truth,
                correct=question_scorer(result.answer, task.ground_truth),
                turns=result.turns,
                usage=result.usage,
                level=task.level,
                stop=result.stop,
                tool_calls=result.tool_calls,
                bad_tool_calls=result.bad_tool_calls,
                failed_tool_calls=result.failed_tool_calls,
                repairs=result.repairs,
                wall_seconds=wall,
            )
        self.recorder.finish_task(task.task_id, outcome.to_dict())
        return outcome

    async def run(self, tasks: list[Task]) -> tuple[list[TaskOutcome], bool]:
        """Run every task; returns the outcomes (dataset order) and whether the run was interrupted."""
        outcomes: dict[str, TaskOutcome] = {}
        todo: list[Task] = []
        for task in tasks:
            previous = self.previous_outcome(task)
            if previous is not None:
                outcomes[task.task_id] = previous
            else:
                todo.append(task)
        if self.progress:
            self.progress.start(total=len(tasks), already=list(outcomes.values()))
        semaphore = asyncio.Semaphore(max(1, self.settings.max_concurrent))

        async def bounded(task: Task) -> None:
            async with semaphore:
                if self.progress:
                    self.progress.task_started(task.task_id)
                outcome = await self.run_task(task)
            outcomes[task.task_id] = outcome
            if self.progress:
                self.progress.task_done(outcome)

        interrupted = False
        try:
            async with asyncio.TaskGroup() as group:
                for task in todo:
                    group.create_task(bounded(task))
        except asyncio.CancelledError:
            interrupted = True
        finally:
            if self.progress:
                self.progress.stop()
            self.recorder.flush()
        ordered = [outcomes[t.task_id] for t in tasks if t.task_id in outcomes]
        return ordered, interrupted


def _describe(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip() or type(cause).__name__
    return f"{type(cause).__name__}: {text}" if not text.startswith(type(cause).__name__) else text


def summarize(
    outcomes: list[TaskOutcome], *, total: int, wall_seconds: float, interrupted: bool
) -> dict[str, Any]:
    """The run's ``summary.json``."""
    completed = [o for o in outcomes if o.status == COMPLETED]
    correct = sum(o.correct for o in outcomes)
    usage = sum((o.usage for o in outcomes), Usage())
    repairs: Counter[str] = Counter()
    by_level: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        repairs.update(o.repairs)
        level = by_level.setdefault(str(o.level), {"tasks": 0, "correct": 0})
        level["tasks"] += 1
        level["correct"] += int(o.correct)
    for level in by_level.values():
        level["accuracy"] = round(level["correct"] / level["tasks"], 4) if level["tasks"] else 0.0
    calls = sum(o.tool_calls for o in outcomes)
    return {
        "tasks": total,
        "finished": len(outcomes),
        "completed": len(completed),
        "failed": sum(1 for o in outcomes if o.status == FAILED),
        "correct": correct,
        "accuracy": round(correct / total, 4) if total else 0.0,
        "by_level": dict(sorted(by_level.items())),
        "turns": sum(o.turns for o in outcomes),
        "tool_calls": calls,
        "bad_tool_calls": sum(o.bad_tool_calls for o in outcomes),
        "failed_tool_calls": sum(o.failed_tool_calls for o in outcomes),
        "parse_rate": round(
            (calls - repairs.get("failed", 0)) / (calls + sum(o.bad_tool_calls for o in outcomes)), 4
        )
        if calls
        else None,
        "repairs": dict(sorted(repairs.items())),
        "usage": usage.to_dict(),
        "wall_seconds": round(wall_seconds, 3),
        "interrupted": interrupted,
    }
