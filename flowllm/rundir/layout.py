"""The run directory's layout: every path of a run is spelled here and nowhere else.

    <run>/summary.json                                    the run's figures
    <run>/usage.jsonl                                     every model call attempt (the usage ledger)
    <run>/judge_usage.jsonl                               the judge's calls (dataset.scorer=judge)
    <run>/app.log                                         the run's log (workers append to it)
    <run>/web_cache/                                      the web tools' cache (tools=web), shared by workers
    <run>/.hydra/config.yaml                              the composed config (flowllm writes it once the
                                                          folder accepts the run; older runs: Hydra wrote it)
    <run>/.hydra/hydra.yaml                               Hydra's own settings of that session
    <run>/.hydra/overrides.yaml                           the command line's overrides (written with config.yaml)
    <run>/fingerprint.json                                the settings that can change a task's result
    <run>/history.jsonl                                   one line per session that ran in the folder
    <run>/tasks/<task_id>/result.json                     one task's outcome
    <run>/tasks/<task_id>/timing.json                     its wall times (apart: they change from run to run)
    <run>/tasks/<task_id>/verdict.json                    the judge's verdict (dataset.scorer=judge)
    <run>/tasks/<task_id>/state.json                      its tools' key-value store (tools.task_state=true)
    <run>/tasks/<task_id>/workspace/                      the task's working directory, kept when it ends (if used)
    <run>/tasks/<task_id>/turn_<NNN>/<NN>_<node>/{input,output,meta}.json
    <run>/tasks/<task_id>/turn_<NNN>/subagents/<name>-<call_id>/turn_<MMM>/...   a sub-agent's conversation
    <run>/tasks/<task_id>/attempts/<n>/                   earlier attempts under pass@k (retry until correct)
    <run>/tasks/<task_id>/epochs/<n>/                     epoch n of experiment.epochs > 1: its own
                                                          result.json, timing.json, turn_<NNN>/, attempts/, workspace/
    <run>/.resume/tasks/<task_id>/[epochs/<n>/]turn_<NNN>/   an unfinished task's saved turns, while a rerun
                                                          resumes it from them (flowllm/run/resume.py)

The recorder writes through it, the experiment resumes through it, replay and inspect read through it. A
conversation is addressed by its *scope*: "" for the task's own, or the path of a sub-agent's (or a
compaction call's) folder under the task, as ``CallContext.scope`` carries it.

A multirun's folder holds one run folder per job and the comparison of them (``SweepLayout``):

    <sweep>/<job>/...                                     a run folder as above
    <sweep>/sweep_summary.json, sweep_summary.md          the jobs compared (sweep/summary.py)
    <sweep>/sweep_accuracy_vs_cost.png                    the plot of them, when matplotlib is installed
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from flowllm.rundir.taskdirs import task_folder_name

SUMMARY_FILE = "summary.json"
LEDGER_FILE = "usage.jsonl"
JUDGE_LEDGER_FILE = "judge_usage.jsonl"
# The run's log: Hydra's job log (``hydra.job.name`` is ``app``); worker processes append to the same file.
LOG_FILE = "app.log"
CONFIG_FILE = ".hydra/config.yaml"
OVERRIDES_FILE = ".hydra/overrides.yaml"
HYDRA_FILE = ".hydra/hydra.yaml"
FINGERPRINT_FILE = "fingerprint.json"
HISTORY_FILE = "history.jsonl"
# A bundled replay's (or fork's) record of the provider whose replies it served, found by following it to the run
# it replayed: a third party has the bundle, not that run (flowllm/bundle/collect.py).
REPLAYED_PROVIDER_FILE = "replayed_provider.json"
WEB_CACHE_DIR = "web_cache"
RESUME_DIR = ".resume"  # a run folder of its own: the saved turns of the tasks a rerun resumes
TASKS_DIR = "tasks"
RESULT_FILE = "result.json"
TIMING_FILE = "timing.json"
DIGESTS_FILE = "digests.json"  # a digest of each node output of the task's run (flowllm/rundir/digests.py)
VERDICT_FILE = "verdict.json"
STATE_FILE = "state.json"  # the task's tools' key-value store (flowllm/tools/state.py)
WORKSPACE_DIR = "workspace"
ATTEMPTS_DIR = "attempts"
EPOCHS_DIR = "epochs"
SUBAGENTS_DIR = "subagents"
LEGACY_AGENTS_DIR = "agents"  # where sub-agents' turns were kept before they were scoped under their turn
INPUT_FILE = "input.json"
OUTPUT_FILE = "output.json"
META_FILE = "meta.json"
ARTIFACT_FILES = (INPUT_FILE, OUTPUT_FILE, META_FILE)
MAIN_AGENT = "main"
SWEEP_SUMMARY_FILE = "sweep_summary.json"
SWEEP_TABLE_FILE = "sweep_summary.md"
SWEEP_PLOT_FILE = "sweep_accuracy_vs_cost.png"
SWEEP_LOCK_FILE = ".sweep_summary.lock"  # held while the comparison is rebuilt (jobs end concurrently)

TURN_RE = re.compile(r"^turn_(\d+)$")
TURN_GLOB = "turn_*"  # every turn folder of a conversation
NODE_RE = re.compile(r"^(\d+)_(.+)$")


# The folder names of the first turns, spelled once: every node of every turn names its turn's folder.
_TURN_FOLDERS = tuple(f"turn_{turn:03d}" for turn in range(256))


def turn_folder(turn: int) -> str:
    if 0 <= turn < len(_TURN_FOLDERS):
        return _TURN_FOLDERS[turn]
    return f"turn_{turn:03d}"


def node_folder(index: int, name: str) -> str:
    """A node's folder: its YAML position and name (``03_call_model``), whatever order the runner used."""
    return f"{index:02d}_{name}"


def subagent_scope(turn: int, agent: str, call_id: str) -> str:
    """The scope of a sub-agent's conversation, started by a tool call of the given turn."""
    return f"{turn_folder(turn)}/{SUBAGENTS_DIR}/{agent}-{call_id}"


def nested_scope(parent_scope: str, turn: int, name: str) -> str:
    """The scope of a one-call conversation of its own (compaction) made during a turn of ``parent_scope``."""
    prefix = f"{parent_scope}/" if parent_scope else ""
    return f"{prefix}{turn_folder(turn)}/{name}"


def nested_origin(scope: str) -> tuple[str, int] | None:
    """The conversation and turn a ``nested_scope`` was made in; None for any other scope (a sub-agent's)."""
    head, sep, _name = scope.rpartition("/")
    parent, _, turn = head.rpartition("/")
    found = TURN_RE.match(turn) if sep else None
    return (parent, int(found.group(1))) if found is not None else None


# How many task folders a ``RunLayout`` remembers (it starts over when full): far more than run at once.
TASK_FOLDERS_KEPT = 4096


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory."""

    root: Path
    # Each task's folder, joined once: a task's records, result, timing and workspace are all under it.
    _task_folders: dict[str, Path] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY_FILE

    @property
    def ledger(self) -> Path:
        return self.root / LEDGER_FILE

    @property
    def log(self) -> Path:
        return self.root / LOG_FILE

    @property
    def judge_ledger(self) -> Path:
        return self.root / JUDGE_LEDGER_FILE

    @property
    def fingerprint(self) -> Path:
        return self.root / FINGERPRINT_FILE

    @property
    def history(self) -> Path:
        return self.root / HISTORY_FILE

    @property
    def web_cache(self) -> Path:
        return self.root / WEB_CACHE_DIR

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def replayed_provider(self) -> Path:
        return self.root / REPLAYED_PROVIDER_FILE

    @property
    def overrides(self) -> Path:
        return self.root / OVERRIDES_FILE

    @property
    def hydra(self) -> Path:
        return self.root / HYDRA_FILE

    @property
    def tasks(self) -> Path:
        return self.root / TASKS_DIR

    @property
    def resume(self) -> RunLayout:
        """Where a rerun keeps the saved turns of the unfinished tasks it resumes: laid out as a run folder."""
        return RunLayout(self.root / RESUME_DIR)

    def task(self, task_id: str) -> Path:
        """A task's folder: its id, or a safe name derived from it when the id cannot name a folder."""
        known = self._task_folders.get(task_id)
        if known is not None:
            return known
        if len(self._task_folders) >= TASK_FOLDERS_KEPT:
            self._task_folders.clear()
        folder = self._task_folders[task_id] = self.tasks / task_folder_name(task_id)
        return folder

    def result(self, task_id: str) -> Path:
        return self.task(task_id) / RESULT_FILE

    def timing(self, task_id: str) -> Path:
        return self.task(task_id) / TIMING_FILE

    def workspace(self, task_id: str) -> Path:
        return self.task(task_id) / WORKSPACE_DIR

    def attempts(self, task_id: str) -> Path:
        return self.task(task_id) / ATTEMPTS_DIR

    def epochs(self, task_id: str) -> Path:
        return self.task(task_id) / EPOCHS_DIR

    def epoch(self, task_id: str, epoch: int) -> Path:
        """Epoch ``epoch`` (from 1) of a task of an ``experiment.epochs`` > 1 run: a task folder of its own."""
        return self.epochs(task_id) / str(epoch)

    def records(self, task_id: str, epoch: int | None = None) -> Path:
        """Where a task's records are: its folder, or its epoch's folder when ``epoch`` is given."""
        return self.task(task_id) if epoch is None else self.epoch(task_id, epoch)

    def conversation(self, task_id: str, scope: str = "", epoch: int | None = None) -> Path:
        """The folder holding a conversation's ``turn_NNN`` folders."""
        base = self.records(task_id, epoch)
        return base / scope if scope else base

    def turn(self, task_id: str, turn: int, scope: str = "", epoch: int | None = None) -> Path:
        return self.conversation(task_id, scope, epoch) / turn_folder(turn)

    def node(self, task_id: str, turn: int, index: int, name: str, scope: str = "", epoch: int | None = None) -> Path:
        return self.turn(task_id, turn, scope, epoch) / node_folder(index, name)


# How many conversation folders a ``TurnDirs`` remembers: far more than the conversations in flight at once.
TURN_DIRS_KEPT = 4096


class TurnDirs:
    """``RunLayout.turn`` folders as strings, without a ``Path`` join per node.

    A replay reads a saved record for every node of every turn: joining the same ``Path`` for each of them costs
    more than reading the file. A conversation's folder is built once per (task, scope, epoch) with
    ``RunLayout.conversation``; its turns and node files are spelled under it (``turn``, ``node_file``), naming
    exactly the paths ``RunLayout.turn`` and ``RunLayout.node(...) / file`` do. Keeps at most ``TURN_DIRS_KEPT``
    folders (it starts over when full), so a long run does not grow it without end.
    """

    def __init__(self, layout: RunLayout, kept: int = TURN_DIRS_KEPT) -> None:
        self.layout = layout
        self.kept = kept
        self._conversations: dict[tuple[str, str, int | None], str] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._conversations)

    def conversation(self, task_id: str, scope: str = "", epoch: int | None = None) -> str:
        key = (task_id, scope, epoch)
        found = self._conversations.get(key)
        if found is not None:
            return found
        folder = str(self.layout.conversation(task_id, scope, epoch))
        with self._lock:
            if len(self._conversations) >= self.kept:
                self._conversations.clear()
            self._conversations[key] = folder
        return folder

    def turn(self, task_id: str, turn: int, scope: str = "", epoch: int | None = None) -> str:
        """``str(RunLayout.turn(task_id, turn, scope, epoch))``."""
        return f"{self.conversation(task_id, scope, epoch)}{os.sep}{turn_folder(turn)}"

    def node_file(
        self, task_id: str, turn: int, index: int, name: str, file: str, scope: str = "", epoch: int | None = None
    ) -> str:
        """``str(RunLayout.node(task_id, turn, index, name, scope, epoch) / file)``."""
        folder = self.conversation(task_id, scope, epoch)
        return f"{folder}{os.sep}{turn_folder(turn)}{os.sep}{node_folder(index, name)}{os.sep}{file}"


@dataclass(frozen=True)
class SweepLayout:
    """The paths of one multirun folder (Hydra's ``hydra.sweep.dir``): its job folders and their comparison."""

    root: Path

    @property
    def summary(self) -> Path:
        return self.root / SWEEP_SUMMARY_FILE

    @property
    def table(self) -> Path:
        return self.root / SWEEP_TABLE_FILE

    @property
    def plot(self) -> Path:
        return self.root / SWEEP_PLOT_FILE

    @property
    def lock(self) -> Path:
        return self.root / SWEEP_LOCK_FILE
