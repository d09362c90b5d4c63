"""An experiment: every selected task of a dataset through the agent, concurrently, scored and recorded.

A task that fails (an exception, a timeout, a missing attachment) is recorded as failed with its error and never
stops the others. Resuming is driven by the files alone, so it survives any crash, SIGKILL included:

* ``tasks/<id>/result.json`` is written last (atomically, after the task's node records), so a task with a
  completed result is finished and is skipped by a rerun into the same run directory;
* a task with a failed result, an unreadable result or none at all is run again from scratch: its turn folders
  and workspace are wiped first, so nothing of an interrupted attempt is counted twice.

``attempts`` > 1 is pass@k: a task is run up to k times and stops at the first correct answer. Earlier attempts'
turn folders are kept under ``tasks/<id>/attempts/<n>/``; the task's own folder holds the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowllm.agent.loop import Agent, AgentResult
from flowllm.core.interfaces import Provider
from flowllm.core.types import Usage
from flowllm.datasets.gaia import Task, question_scorer, task_prompt
from flowllm.engine import Recorder
from flowllm.engine.recorder import read_json
from flowllm.experiment.pricing import PriceTable, cost_summary, uncached_input
from flowllm.experiment.progress import ProgressReporter
from flowllm.tools import ToolCatalog, open_tool_catalog, open_tool_pool

log = logging.getLogger(__name__)

COMPLETED = "completed"
FAILED = "failed"
ATTEMPTS_DIR = "attempts"

__all__ = [
    "COMPLETED",
    "FAILED",
    "Experiment",
    "ExperimentSettings",
    "TaskOutcome",
    "load_outcomes",
    "safe_task_dir_name",
    "summarize",
    "task_prompt",
]


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
    # pass@k: how many attempts ran, and what each one gave (usage above is the sum over all of them).
    attempts: int = 1
    attempt_log: list[dict[str, Any]] = field(default_factory=list)

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
            "attempts": self.attempts,
            "attempt_log": self.attempt_log,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskOutcome:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["usage"] = Usage.from_dict(data.get("usage"))
        return cls(**known)

    def attempt_entry(self, number: int) -> dict[str, Any]:
        return {
            "attempt": number,
            "status": self.status,
            "answer": self.answer,
            "correct": self.correct,
            "turns": self.turns,
            "stop": self.stop,
            "error": self.error,
            "usage": self.usage.to_dict(),
            "wall_seconds": round(self.wall_seconds, 3),
        }


def safe_task_dir_name(task_id: str) -> str:
    if not task_id or task_id in (".", "..") or any(sep in task_id for sep in ("/", "\\", os.sep)):
        raise ValueError(f"task_id {task_id!r} cannot name a folder")
    return task_id


def read_outcome(path: Path) -> TaskOutcome | None:
    """A task's saved outcome, or None when there is none or it cannot be read (then the task reruns)."""
    if not path.is_file():
        return None
    try:
        data = read_json(path)
        return TaskOutcome.from_dict(data) if isinstance(data, dict) else None
    except Exception:
        return None


def load_outcomes(run_dir: Path, tasks: Iterable[Task]) -> list[TaskOutcome]:
    """The outcomes on disk for ``tasks`` (dataset order): how a summary is rebuilt after an interruption."""
    found = []
    for task in tasks:
        outcome = read_outcome(Path(run_dir) / "tasks" / task.task_id / "result.json")
        if outcome is not None:
            found.append(outcome)
    return found


@dataclass
class ExperimentSettings:
    max_concurrent: int = 4
    task_timeout_s: float = 900.0
    resume: bool = True
    attempts: int = 1  # pass@k: up to k attempts per task, stopping at the first correct one


@dataclass
class RunResult:
    outcomes: list[TaskOutcome]  # dataset order; tasks that never finished are absent
    interrupted: bool
    resumed: int  # tasks skipped because an earlier run completed them
    tools_unavailable: dict[str, str] = field(default_factory=dict)  # server -> why (disabled, failed to start)


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
        if settings.attempts < 1:
            raise ValueError(f"experiment.attempts must be at least 1, not {settings.attempts}")
        self.agent = agent
        self.provider = provider
        self.tools_cfg = tools_cfg
        self.recorder = recorder
        self.settings = settings
        self.progress = progress
        self.open_tools = open_tools
        # Tools are listed once per run; each task's pool then starts a server on its first call only.
        self.tools_catalog: ToolCatalog | None = None

    def previous_outcome(self, task: Task) -> TaskOutcome | None:
        if not self.settings.resume:
            return None
        outcome = read_outcome(self.recorder.task_dir(task.task_id) / "result.json")
        return outcome if outcome is not None and outcome.status == COMPLETED else None

    def _fresh_task_dir(self, task: Task) -> None:
        """A (re)run starts clean: an interrupted or failed earlier run leaves nothing that could be counted."""
        task_dir = self.recorder.task_dir(safe_task_dir_name(task.task_id))
        for stale in (*task_dir.glob("turn_*"), task_dir / "workspace", task_dir / ATTEMPTS_DIR, task_dir / "agents"):
            shutil.rmtree(stale, ignore_errors=True)
        for partial in task_dir.glob(".*.tmp"):  # half-written files of a process killed mid-write
            partial.unlink(missing_ok=True)
        (task_dir / "result.json").unlink(missing_ok=True)

    def _workspace(self, task: Task) -> Path:
        workspace = self.recorder.task_dir(task.task_id) / "workspace"
        shutil.rmtree(workspace, ignore_errors=True)
        workspace.mkdir(parents=True)
        if task.attachment is not None:
            if not task.attachment.is_file():
                raise FileNotFoundError(f"attachment '{task.file_name}' is missing from the dataset folder")
            shutil.copy2(task.attachment, workspace / Path(task.file_name or "").name)
        return workspace

    def _shelve_attempt(self, task: Task, number: int) -> None:
        """Move a finished attempt's records aside so the next attempt starts from the task folder again."""
        self.recorder.flush()  # the background writer must not still be writing into the folders we move
        task_dir = self.recorder.task_dir(task.task_id)
        target = task_dir / ATTEMPTS_DIR / str(number)
        target.mkdir(parents=True, exist_ok=True)
        for item in (*sorted(task_dir.glob("turn_*")), task_dir / "agents", task_dir / "workspace"):
            if item.exists():
                shutil.move(str(item), str(target / item.name))
        self.recorder.discard_task(task.task_id)

    async def attempt(self, task: Task) -> TaskOutcome:
        """One attempt at a task, scored; never raises except on cancellation."""
        started = time.perf_counter()
        result: AgentResult | None = None
        error: str | None = None
        try:
            workspace = self._workspace(task)
            async with asyncio.timeout(self.settings.task_timeout_s):
                async with self._open_tools(workspace) as tools:
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
            return TaskOutcome(
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
        return TaskOutcome(
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

    async def run_task(self, task: Task) -> TaskOutcome:
        """All attempts at a task; writes its ``result.json`` once, at the end."""
        self._fresh_task_dir(task)
        log_entries: list[dict[str, Any]] = []
        usage = Usage()
        wall = 0.0
        outcome: TaskOutcome | None = None
        for number in range(1, self.settings.attempts + 1):
            if outcome is not None:
                await asyncio.to_thread(self._shelve_attempt, task, number - 1)
            outcome = await self.attempt(task)
            log_entries.append(outcome.attempt_entry(number))
            usage = usage + outcome.usage
            wall += outcome.wall_seconds
            if outcome.correct:
                break
        assert outcome is not None
        outcome.attempts = len(log_entries)
        outcome.usage = usage
        outcome.wall_seconds = wall
        outcome.attempt_log = log_entries if len(log_entries) > 1 else []
        self.recorder.finish_task(task.task_id, outcome.to_dict())
        return outcome

    def _open_tools(self, workspace: Path) -> Any:
        if self.tools_catalog is not None:
            return self.open_tools(self.tools_cfg, workspace, catalog=self.tools_catalog)
        return self.open_tools(self.tools_cfg, workspace)

    async def _discover_tools(self, stack: contextlib.AsyncExitStack) -> None:
        """Check the servers once for the run; the run-scoped ones stay connected until ``stack`` closes."""
        if self.open_tools is not open_tool_pool:
            return
        self.tools_catalog = await stack.enter_async_context(open_tool_catalog(self.tools_cfg))

    async def run(self, tasks: list[Task]) -> RunResult:
        """Run every task not completed before; outcomes come back in dataset order."""
        outcomes: dict[str, TaskOutcome] = {}
        todo: list[Task] = []
        for task in tasks:
            safe_task_dir_name(task.task_id)
            previous = self.previous_outcome(task)
            if previous is not None:
                outcomes[task.task_id] = previous
            else:
                todo.append(task)
        resumed = len(outcomes)
        tools_stack = contextlib.AsyncExitStack()
        if todo:
            await self._discover_tools(tools_stack)
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
            # Ctrl-C (asyncio.run cancels the main task): the running tasks were cancelled by the group and
            # wrote no result, so a rerun runs them again; what finished is kept.
            interrupted = True
        finally:
            if self.progress:
                self.progress.stop()
            await tools_stack.aclose()
            await asyncio.to_thread(self.recorder.flush)
        ordered = [outcomes[t.task_id] for t in tasks if t.task_id in outcomes]
        unavailable = dict(self.tools_catalog.unavailable) if self.tools_catalog is not None else {}
        return RunResult(ordered, interrupted, resumed, tools_unavailable=unavailable)


def _describe(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip() or type(cause).__name__
    return f"{type(cause).__name__}: {text}" if not text.startswith(type(cause).__name__) else text


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
) -> dict[str, Any]:
    """The run's ``summary.json``: accuracy overall and by level, tool calls, repairs, tokens, cost, time."""
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
    bad = sum(o.bad_tool_calls for o in outcomes)
    # Made: every tool call the model wrote, malformed blocks included. Parsed: those whose arguments became a
    # dict (at whichever repair stage). The parse rate is their ratio.
    made = calls + bad
    parsed = calls - repairs.get("failed", 0)
    cost = cost_summary(usage, model, prices)
    return {
        "tasks": total,
        "finished": len(outcomes),
        "completed": len(completed),
        "failed": sum(1 for o in outcomes if o.status == FAILED),
        "unfinished": total - len(outcomes),
        "resumed": resumed,
        "correct": correct,
        "accuracy": round(correct / total, 4) if total else 0.0,
        "by_level": dict(sorted(by_level.items())),
        "attempts": attempts,
        "attempts_used": sum(o.attempts for o in outcomes),
        "turns": sum(o.turns for o in outcomes),
        "tool_calls": calls,
        "bad_tool_calls": bad,
        "failed_tool_calls": sum(o.failed_tool_calls for o in outcomes),
        "tool_calls_made": made,
        "tool_calls_parsed": parsed,
        "parse_rate": round(parsed / made, 4) if made else None,
        "repairs": dict(sorted(repairs.items())),
        "usage": usage.to_dict(),
        "tokens": {
            "input_uncached": uncached_input(usage),
            "cache_read": usage.cache_read_tokens,
            "cache_write": usage.cache_write_tokens,
            "output": usage.output_tokens,
            "reasoning": usage.reasoning_tokens,
            "total": usage.total_tokens,
        },
        "cost": cost,
        "cost_usd": cost["total_usd"],
        "wall_seconds": round(wall_seconds, 3),
        "interrupted": interrupted,
    }
