"""Reading a saved run back: the one place that knows the recorder's layout from the reader's side.

    <run>/summary.json, <run>/.hydra/config.yaml
    <run>/tasks/<task_id>/result.json
    <run>/tasks/<task_id>/turn_<NNN>/<NN>_<node>/{input,output,meta}.json
    <run>/tasks/<task_id>/turn_<NNN>/subagents/<name>-<call_id>/turn_<MMM>/...   (sub-agents; --agent takes
                                                           the path from turn_<NNN>, or the older agents/<name>)
    <run>/tasks/<task_id>/epochs/<n>/turn_<NNN>/...       (experiment.epochs > 1: --agent epochs/<n>, and
                                                           epochs/<n>/turn_<NNN>/subagents/... for its sub-agents)
    <run>/tasks/<task_id>/attempts/<n>/turn_<NNN>/...     (an earlier attempt of experiment.attempts > 1:
                                                           --agent attempts/<n>, or epochs/<m>/attempts/<n>)

Everything here is tolerant by design: a run is read to find out what went wrong, so a truncated file, a
missing ``meta.json`` or a task that never wrote its ``result.json`` becomes a *problem* attached to the
record (and shown to the user), never an exception that hides the rest of the run. Only a folder that is not
a run at all raises ``NotARunError``. Node inputs and outputs are read lazily: they hold whole histories and
a run can have thousands of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from flowllm.errors import CliError
from flowllm.rundir.layout import (
    ARTIFACT_FILES,
    ATTEMPTS_DIR,
    EPOCHS_DIR,
    LEGACY_AGENTS_DIR,
    MAIN_AGENT,
    RESULT_FILE,
    SUBAGENTS_DIR,
    SUMMARY_FILE,
    TASKS_DIR,
    TURN_RE,
    RunLayout,
)
from flowllm.rundir.records import Artifact, NodeRecord, TurnRecord, read_artifact, read_turns
from flowllm.rundir.results import RunSummary, TaskResult
from flowllm.rundir.store import local_run
from flowllm.scoring.tally import finished, is_finished, score_tally

__all__ = [
    "ARTIFACT_FILES",
    "MAIN_AGENT",
    "Artifact",
    "NodeRecord",
    "NotARunError",
    "RunRecord",
    "TaskRecord",
    "TurnRecord",
    "is_computed",
    "is_run_dir",
    "multirun_jobs",
    "open_run",
    "read_artifact",
    "read_task",
    "read_turns",
    "summary_figures",
    "task_summary",
]


class NotARunError(CliError):
    """The folder is not a flowllm run (or multirun); the message says what was expected."""


@dataclass
class TaskRecord:
    """One task of a run. ``result`` may be missing (the task never finished) or corrupt."""

    task_id: str
    path: Path
    result: Artifact
    turns: list[TurnRecord]
    agents: dict[str, list[TurnRecord]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @cached_property
    def result_record(self) -> TaskResult | None:
        """``result.json`` as its record; None when the task has none that reads as a JSON object."""
        value = self.result.value
        return TaskResult.from_dict(value) if self.result.ok and isinstance(value, dict) else None

    @property
    def record(self) -> TaskResult:
        """The result's record, or an empty one (every field at its default) when there is none."""
        return self.result_record or TaskResult.from_dict({})

    @property
    def status(self) -> str:
        if not self.result.ok:
            return "unfinished" if self.result.missing else "unreadable"
        return str(self.record.status or "unknown")

    @property
    def correct(self) -> bool | None:
        """True or False when scored; None when unscored (no ground truth; a diverged replay) or unfinished (the
        budget stopped it: the reduced result of a task stopped between its epochs says false all the same)."""
        value = self.record.correct
        return value if isinstance(value, bool) and is_finished(self.status) else None

    @property
    def level(self) -> int | None:
        value: Any = self.record.level
        return int(value) if isinstance(value, (int, float)) or (isinstance(value, str) and value.isdigit()) else None

    @property
    def error(self) -> str | None:
        if not self.result.ok:
            return self.result.error
        value = self.record.error
        return str(value) if value else None

    def turns_of(self, agent: str = MAIN_AGENT) -> list[TurnRecord]:
        if agent == MAIN_AGENT:
            return self.turns
        if agent not in self.agents:
            known = ", ".join(sorted(self.agents)) or "none"
            raise KeyError(f"task '{self.task_id}' has no sub-agent '{agent}' (sub-agents: {known})")
        return self.agents[agent]

    def turn(self, number: int, agent: str = MAIN_AGENT) -> TurnRecord | None:
        return next((t for t in self.turns_of(agent) if t.number == number), None)

    @property
    def epochs(self) -> list[str]:
        """The conversations of the task's epochs (``epochs/1``...), in epoch order; empty without epochs."""
        return sorted((a for a in self.agents if a.count("/") == 1 and a.startswith(f"{EPOCHS_DIR}/")), key=_epoch)

    def all_turns(self) -> Iterator[tuple[str, TurnRecord]]:
        """(agent, turn) for the main agent and every other conversation (sub-agents, epochs)."""
        for t in self.turns:
            yield MAIN_AGENT, t
        for agent, turns in sorted(self.agents.items()):
            for t in turns:
                yield agent, t


def _numbered(folder: Path) -> list[Path]:
    """The numbered folders of ``folder`` (epochs/1, attempts/2...), in number order."""
    found = [p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(p.name))


def _scopes(path: Path) -> list[Path]:
    """The folders of a task that hold conversations: the task's, its epochs' (``experiment.epochs``), and the
    earlier attempts of either (``experiment.attempts``)."""
    runs = [path, *_numbered(path / EPOCHS_DIR)]
    return [scope for run in runs for scope in (run, *_numbered(run / ATTEMPTS_DIR))]


def _epoch(agent: str) -> int:
    return int(agent.rsplit("/", 1)[1])


def read_task(path: Path) -> TaskRecord:
    turns, notes = read_turns(path)
    agents: dict[str, list[TurnRecord]] = {}
    # A conversation is named by its folder's path from the task's: a sub-agent's sits under the turn that called
    # it (turn_002/subagents/analyst-c1), an epoch's under epochs/ (epochs/2, and epochs/2/turn_002/subagents/...),
    # an earlier attempt's under attempts/ (attempts/1, epochs/2/attempts/1).
    for scope in _scopes(path):
        if scope != path:
            agents[scope.relative_to(path).as_posix()], more = read_turns(scope)
            notes.extend(more)
        for agent_dir in sorted(p for p in scope.glob(f"turn_*/{SUBAGENTS_DIR}/*") if p.is_dir()):
            agents[agent_dir.relative_to(path).as_posix()], more = read_turns(agent_dir)
            notes.extend(more)
    agents_dir = path / LEGACY_AGENTS_DIR  # the layout before sub-agents were scoped under their turn
    if agents_dir.is_dir():
        for agent_dir in sorted(p for p in agents_dir.iterdir() if p.is_dir()):
            agents[agent_dir.name], more = read_turns(agent_dir)
            notes.extend(more)
    result = read_artifact(path / RESULT_FILE)
    problems = list(notes)
    if not result.ok:
        problems.append(
            "no result.json: the task did not finish (interrupted, or still running)"
            if result.missing
            else result.error or "result.json unreadable"
        )
    return TaskRecord(path.name, path, result, turns, agents, problems)


@dataclass
class RunRecord:
    """A run directory, read tolerantly. ``problems`` lists what could not be read."""

    path: Path
    summary: Artifact
    tasks: list[TaskRecord]
    config: dict[str, Any] | None = None
    overrides: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def task(self, task_id: str) -> TaskRecord:
        for t in self.tasks:
            if t.task_id == task_id:
                return t
        # A prefix is enough when it is unambiguous: task ids are long.
        hits = [t for t in self.tasks if t.task_id.startswith(task_id)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise KeyError(f"task '{task_id}' is ambiguous: {', '.join(t.task_id for t in hits)}")
        raise KeyError(f"no task '{task_id}' in {self.path} (tasks: {', '.join(t.task_id for t in self.tasks)})")

    @cached_property
    def summary_record(self) -> RunSummary | None:
        """``summary.json`` as its record; None when the run has none that reads as a JSON object."""
        value = self.summary.value
        return RunSummary.from_dict(value) if self.summary.ok and isinstance(value, dict) else None

    def main_settings(self) -> dict[str, Any]:
        """What the run was: its experiment, provider, model, protocol, runner and repair chain."""
        return {
            "experiment": self.setting("experiment.name"),
            "provider": self.setting("provider.name"),
            "model": self.setting("provider.model"),
            "protocol": self.setting("provider.protocol"),
            "runner": self.setting("runner.name"),
            "repair": self.setting("repair.name"),
        }

    def setting(self, dotted: str) -> Any:
        """A value of the run's summary, else of its saved config (``provider.model``...)."""
        summary = self.summary_record
        if summary is not None:
            recorded = {
                "provider.name": summary.provider,
                "provider.model": summary.model,
                "runner.name": summary.runner,
                "repair.name": summary.repair,
                "experiment.name": summary.experiment,
            }
            if recorded.get(dotted) is not None:
                return recorded[dotted]
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    @property
    def label(self) -> str:
        return self.path.name


def _load_config(run_dir: Path) -> tuple[dict[str, Any] | None, list[str], str | None]:
    """The saved composed config (plain, unresolved), the Hydra overrides, and a problem if any."""
    layout = RunLayout(run_dir)
    config_path = layout.config
    if not config_path.is_file():
        return None, [], "no .hydra/config.yaml: the run's configuration is unknown"
    import yaml  # PyYAML comes with Hydra; imported here so the layout code stays light

    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        return None, [], f".hydra/config.yaml cannot be read: {str(exc).splitlines()[0]}"
    overrides: list[str] = []
    overrides_path = layout.overrides
    if overrides_path.is_file():
        try:
            loaded = yaml.safe_load(overrides_path.read_text(encoding="utf-8"))
            overrides = [str(o) for o in loaded or []]
        except (yaml.YAMLError, OSError, UnicodeDecodeError):
            pass  # overrides are a label only; the config itself was read
    return (config if isinstance(config, dict) else None), overrides, None


def _task_dirs(run_dir: Path) -> tuple[list[Path], str | None]:
    tasks_dir = run_dir / TASKS_DIR
    if tasks_dir.is_dir():
        return sorted(p for p in tasks_dir.iterdir() if p.is_dir()), None
    # An older layout kept task folders at the top of the run directory.
    legacy = sorted(
        p
        for p in run_dir.iterdir()
        if p.is_dir() and not p.name.startswith(".") and any(TURN_RE.match(c.name) for c in p.iterdir())
    )
    if legacy:
        return legacy, "older layout: task folders sit at the top of the run directory (no tasks/ folder)"
    return [], None


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and ((path / SUMMARY_FILE).is_file() or (path / TASKS_DIR).is_dir())


def multirun_jobs(path: Path) -> list[Path]:
    """The job folders of a Hydra multirun directory (``0``, ``1``...), in job order; empty if not one."""
    if not path.is_dir():
        return []
    jobs = [p for p in path.iterdir() if p.is_dir() and is_run_dir(p)]
    return sorted(jobs, key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name))


def open_run(path: Path | str) -> RunRecord:
    """Read a run directory; raises ``NotARunError`` (with what to do) only when it is not a run at all."""
    run_dir = local_run(path)  # a store's URL (experiment.store): its local copy
    if not run_dir.exists():
        raise NotARunError(f"{run_dir} does not exist")
    if not run_dir.is_dir():
        raise NotARunError(f"{run_dir} is a file, not a run directory")
    task_dirs, layout_note = _task_dirs(run_dir)
    summary = read_artifact(run_dir / SUMMARY_FILE)
    if not task_dirs and summary.missing and not (run_dir / TASKS_DIR).is_dir():
        jobs = multirun_jobs(run_dir)
        if jobs:
            raise NotARunError(
                f"{run_dir} is a multirun folder with {len(jobs)} runs ({', '.join(j.name for j in jobs[:8])}"
                f"{'...' if len(jobs) > 8 else ''}): inspect one of them, or use "
                f"`python -m flowllm.inspect report {run_dir}` for the sweep comparison"
            )
        raise NotARunError(
            f"{run_dir} is not a flowllm run: expected summary.json and a tasks/ folder (a run directory is "
            "what hydra.run.dir names, e.g. runs/<date>/<time>)"
        )
    problems: list[str] = []
    if layout_note:
        problems.append(layout_note)
    if summary.missing:
        problems.append("no summary.json: the run was interrupted or is still running; figures come from the tasks")
    elif not summary.ok:
        problems.append(f"{summary.error}; figures come from the tasks")
    config, overrides, config_problem = _load_config(run_dir)
    if config_problem:
        problems.append(config_problem)
    tasks = [read_task(p) for p in task_dirs]
    return RunRecord(run_dir, summary, tasks, config, overrides, problems)


def task_summary(run: RunRecord) -> dict[str, Any]:
    """The run's headline figures as JSON (``--json``, the report): summary.json when readable, else computed
    from the tasks' results (with ``computed``: true)."""
    if run.summary_record is not None:
        return dict(run.summary.value)
    return _computed_summary(run)


def summary_figures(run: RunRecord) -> RunSummary:
    """The run's headline figures as a record: summary.json's, else computed from the tasks' results (then
    ``is_computed(run)``)."""
    return run.summary_record or RunSummary.from_dict(_computed_summary(run))


def is_computed(run: RunRecord) -> bool:
    """Whether the run's figures are computed from its tasks (summary.json unreadable or missing)."""
    return run.summary_record is None


def _computed_summary(run: RunRecord) -> dict[str, Any]:
    recorded = [t for t in run.tasks if t.result.ok]
    results = finished(recorded)  # a task the run's budget stopped is unfinished
    tally = score_tally(results)  # counted as summary.json counts: over the scored finished tasks
    total = len(run.tasks)
    repairs: Counter[str] = Counter()
    usage: Counter[str] = Counter()
    for t in recorded:
        result = t.record
        if isinstance(result.repairs, dict):
            repairs.update({str(k): int(v) for k, v in result.repairs.items() if isinstance(v, int)})
        if isinstance(result.usage, dict):
            usage.update(
                {str(k): int(v) for k, v in result.usage.items() if isinstance(v, int) and not isinstance(v, bool)}
            )
    calls = sum(int(t.record.tool_calls or 0) for t in run.tasks)
    bad = sum(int(t.record.bad_tool_calls or 0) for t in run.tasks)
    return {
        "tasks": total,
        "finished": len(results),
        "completed": sum(1 for t in run.tasks if t.status == "completed"),
        "failed": sum(1 for t in run.tasks if t.status == "failed"),
        "unfinished": total - len(results),
        "correct": tally["correct"],
        "scored": tally["scored"],
        "unscored": tally["unscored"],
        "accuracy": tally["accuracy"],
        "turns": sum(int(t.record.turns or 0) for t in run.tasks),
        "tool_calls": calls,
        "bad_tool_calls": bad,
        "failed_tool_calls": sum(int(t.record.failed_tool_calls or 0) for t in run.tasks),
        # The same definition as the experiment's summary.json.
        "parse_rate": round((calls - repairs.get("failed", 0)) / (calls + bad), 4) if calls else None,
        "repairs": dict(sorted(repairs.items())),
        "usage": dict(usage),
        "computed": True,
    }
