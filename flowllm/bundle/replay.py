"""One bundled run replayed offline from its saved replies (``provider=replay``, in a child process with no key
in its environment), and each task of the replay compared with the bundle's: it replayed exactly, gave the same
answer and the same score."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from omegaconf import OmegaConf

from flowllm.bundle.answers import answer_hash
from flowllm.engine.recorder import environment_secrets
from flowllm.rundir.layout import EPOCHS_DIR, OUTPUT_FILE, OVERRIDES_FILE, RESULT_FILE, TASKS_DIR, RunLayout
from flowllm.rundir.results import RunSummary, TaskResult
from flowllm.scoring.tally import replay_scored

__all__ = ["Replayed", "compare_tasks", "replay_run"]

# Overrides of the saved run that the replay sets itself or that would reach out (telemetry, the object store the
# run was kept in, the Redis its machines shared), by their key: a verification runs offline, in its own folder.
_REPLACED = (
    "provider",
    "hydra",
    "telemetry",
    "dataset.path",
    "progress",
    "experiment.store",
    "experiment.coordination",
)
REPLAY_TIMEOUT_S = 3600
OK_EXITS = (0, 3, 4)  # the replay ran (tasks that failed in the saved run fail again)
COMPARED = ("status", "answer", "correct")
# A task its budget or a limit stopped: the replay stops where it did (flowllm/spend/saved_stops.py), after as
# many turns, having used as much (a task of several attempts sums them, which a replay of its last one does not).
STOPPED = ("budget", "limit")


def _compared(saved: TaskResult) -> tuple[str, ...]:
    if saved.status not in STOPPED:
        return COMPARED
    return (*COMPARED, "turns", "limit", *(("usage",) if saved.attempts == 1 else ()))


@dataclass
class Replayed:
    """The replay's run folder, or why it did not run."""

    run_dir: Path
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    exact: int = 0
    tasks: int = 0
    hash_correct: int = 0  # the tasks scored by their answer's hash that it calls right
    unscored_by_verdict: int = 0  # the bundled replay's tasks its own replay verdict left unscored (diverged...)


def _kept(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0]
    return not any(key == k or key.startswith(k + ".") or key.startswith(k + "@") for k in _REPLACED)


def _overrides(run_dir: Path) -> list[str]:
    path = run_dir / OVERRIDES_FILE
    saved = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else []
    return [str(o) for o in (saved if isinstance(saved, list) else []) if _kept(str(o))]


def _environment() -> dict[str, str]:
    """This process's environment without any variable that holds a secret: the replay needs no key."""
    secrets = set(environment_secrets())
    return {name: value for name, value in os.environ.items() if value not in secrets}


def replay_run(run_dir: Path, dataset: Path, out: Path) -> Replayed:
    """Replay the unpacked run ``run_dir`` against ``dataset`` into ``out``."""
    args = [
        *_overrides(run_dir),
        "provider=replay",
        f"provider.run_dir={run_dir}",
        f"dataset.path={dataset.resolve()}",
        "progress=false",
        f"hydra.run.dir={out}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "flowllm", *args],
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=REPLAY_TIMEOUT_S,
        env=_environment(),
        check=False,
    )
    found = Replayed(out)
    if done.returncode not in OK_EXITS or not RunLayout(out).summary.is_file():
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        found.error = f"the replay did not run (exit {done.returncode}): {last}"
    return found


def _results(run_dir: Path) -> dict[str, tuple[Path, TaskResult]]:
    found = {}
    for path in sorted((run_dir / TASKS_DIR).glob(f"*/{RESULT_FILE}")):
        result = TaskResult.from_dict(orjson.loads(path.read_bytes()))
        found[result.task_id] = (path, result)
    return found


def _where(root: Path, task_dir: Path, verdict: dict[str, object]) -> str:
    """The saved file of the node where the replay first differed (or the task's folder), in the task's own
    conversation, a sub-agent's (``scope``) or an epoch's."""
    scope = str(verdict.get("scope") or "")
    turn, node = verdict.get("turn"), verdict.get("node")
    if isinstance(turn, int) and node:
        pattern = f"{scope + '/' if scope else ''}turn_{turn:03d}/*_{node}/{OUTPUT_FILE}"
        hits = sorted([*task_dir.glob(pattern), *task_dir.glob(f"{EPOCHS_DIR}/*/{pattern}")])
        if hits:
            return hits[0].relative_to(root).as_posix()
    return task_dir.relative_to(root).as_posix()


def compare_tasks(saved_run: Path, replayed: Replayed, by_hash: dict[str, str | None], root: Path) -> None:
    """Each task of the replay against the bundle's: exact, same answer, same score (for a task in ``by_hash``,
    whose answer the dataset lacks: whether the answer's hash is the recorded one); problems name the first turn
    and the file that did not reproduce, relative to ``root`` (the bundle's)."""
    saved = _results(saved_run)
    again = _results(replayed.run_dir)
    replayed.tasks = len(saved)
    for task_id, (path, result) in saved.items():
        rel = path.relative_to(root).as_posix()
        if task_id not in again:
            replayed.problems.append(f"task {task_id}: the replay has no result ({rel})")
            continue
        new = again[task_id][1]
        verdict = new.replay or {}
        status = verdict.get("status")
        if status != "exact" and result.status == new.status == "completed":
            turn = verdict.get("turn")
            where = _where(root, path.parent, verdict)
            replayed.problems.append(
                f"task {task_id}: {status or 'not replayed'} at turn {turn} ({verdict.get('node')}): {where}"
            )
            continue
        replayed.exact += status == "exact" or result.status == new.status != "completed"
        if not replay_scored(result.replay):
            # A replay's task that parted from the run it replayed is unscored by that verdict, which is the bundled
            # run's own (against a run the bundle need not hold); replayed against the bundle, it replays exactly.
            replayed.unscored_by_verdict += 1
            new.correct = None
        elif task_id in by_hash:
            new.correct = new.answer is not None and answer_hash(new.answer) == by_hash[task_id]
            replayed.hash_correct += new.correct
        for name in _compared(result):
            if getattr(result, name) != getattr(new, name):
                replayed.problems.append(
                    f"task {task_id}: {rel} says {name} {getattr(result, name)!r}, the replay gives "
                    f"{getattr(new, name)!r}"
                )


def replay_summary(replayed: Replayed) -> RunSummary:
    return RunSummary.from_dict(orjson.loads(RunLayout(replayed.run_dir).summary.read_bytes()))
