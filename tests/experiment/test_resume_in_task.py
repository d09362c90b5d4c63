"""Resume inside a task: a run SIGKILLed while tasks are in their middle turns, rerun into the same folder,
ends with the results of an uninterrupted run, and the emulator answered no turn twice.

The kill is deterministic: the emulator (started here, so it outlives the run) holds resume-b's first turn-3
request (a delay fault on its first attempt: no reply is saved), and the test's sleep server holds resume-a's
turn-2 tool call while the test's gate is closed (its turn-2 reply is saved and paid, its turn unfinished).
The test kills the run once both are held, resume-c has finished and the held tasks' replies are on disk.
Tasks stopped by the run's budget resume the same way when a rerun raises it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flowllm.emulator import Emulator
from flowllm.emulator.faults import FaultPlan
from flowllm.rundir.results import RunSummary, TaskResult
from tests.appfork import run_app, start_app
from tests.experiment.helpers import DATA, ROOT, TEST_CONF, run_flowllm

pytestmark = pytest.mark.long

RESUME = DATA / "resume"
TASKS = ("resume-a", "resume-b", "resume-c")
RESUME_KEYS = ("resumed_turns", "resume_divergence")


def held_call(attempt: int) -> FaultPlan:
    """resume-b's turn-3 request, the ``attempt``-th the emulator sees, is answered only after the test ends."""
    rule = {"fault": "delay", "delay_s": 60, "tasks": ["resume-b"], "turns": [3], "attempts": [attempt]}
    return FaultPlan.parse({"rules": [rule]})


@dataclass
class Session:
    """One run folder against one emulator; ``gate`` is the sleep server's ($SLEEP_GATE)."""

    run_dir: Path
    emulator: Emulator
    gate: Path
    extra: tuple[str, ...]

    @property
    def env(self) -> dict[str, str]:
        return {"SLEEP_GATE": str(self.gate)}

    def args(self) -> list[str]:
        # The emulator started here answers (a fork's live provider: resume_live): it outlives the kill.
        provider = () if "provider=replay" in self.extra else ("provider.emulator_script=null", "provider.base_url=")
        return [
            "progress=false",
            f"dataset.path={RESUME}",
            *(f"{p}{self.emulator.base_url}" if p.endswith("=") else p for p in provider),
            "preflight.providers=false",
            f"hydra.searchpath=[file://{TEST_CONF}]",
            "tools=gated",
            "experiment.max_concurrent=3",
            f"hydra.run.dir={self.run_dir}",
            *self.extra,
        ]

    def run(self) -> subprocess.CompletedProcess[str]:
        done = run_flowllm(*self.args(), env=self.env, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done

    def answered(self) -> Counter[tuple[str | None, str | None, int | None]]:
        """The model calls the emulator answered, by task, agent and turn."""
        return Counter((r.task_id, r.agent, r.turn) for r in self.emulator.requests if r.status == 200)


class Sessions:
    """Run folders of one test module, each against its own emulator; stopped when the module ends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.emulators: list[Emulator] = []

    def __call__(self, name: str, *extra: str, faults: FaultPlan | None = None) -> Session:
        emulator = Emulator(RESUME / "script.yaml", faults=faults or FaultPlan())
        emulator.start()
        self.emulators.append(emulator)
        gate = self.root / f"{name}-gate"
        gate.mkdir()
        return Session(self.root / name, emulator, gate, extra)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    made = Sessions(tmp_path_factory.mktemp("resume"))
    yield made
    for emulator in made.emulators:
        emulator.stop(timeout_s=2)


@pytest.fixture(scope="module")
def reference(sessions: Sessions) -> Session:
    """The uninterrupted run the plain resumes are compared with (and the saved run the fork replays)."""
    done = sessions("reference")
    done.run()
    return done


def call_saved(records: Path, turn: int) -> bool:
    return any((records / f"turn_{turn:03d}").glob("*_call_model/output.json"))


def kill_when(s: Session, held: Callable[[], bool], poll_s: float = 0.05) -> None:
    """Run ``s`` with its tool gate closed until ``held()``, then SIGKILL the run and its workers."""
    (s.gate / "closed").touch()
    log = s.run_dir.parent / f"{s.run_dir.name}.log"
    with log.open("w") as out:
        proc = start_app(
            list(s.args()),
            cwd=ROOT,
            stdout=out.fileno(),
            stderr=out.fileno(),
            env={**os.environ, **s.env},
            new_session=True,  # its workers too: the kill hits the whole group
        )
    try:
        deadline = time.monotonic() + 120
        while not held():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(poll_s)
    finally:
        kill_tree(proc.pid)
        proc.wait()
        (s.gate / "closed").unlink()


def kill_tree(pid: int) -> None:
    """SIGKILL the run ``pid`` leads, its workers and their tool servers, and return once none of them runs.

    Workers have process groups of their own (flowllm/experiment/workers.py) and die with their parent through
    PR_SET_PDEATHSIG, which the kernel sends as the parent exits: a worker may still send a request after the
    parent is reaped. Seen under load: a held task's next model call went out once the gate opened, 19 ms after
    the kill, and was answered twice. So the run is stopped first (it spawns nothing more), every process below
    it is killed, and the gate opens only when they are gone."""
    os.killpg(pid, signal.SIGSTOP)
    below = descendants(pid)
    for child in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while any(running(child) for child in below):
        assert time.monotonic() < deadline, f"processes of the killed run still run: {below}"
        time.sleep(0.01)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a zombie runs no code)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_mid_task(s: Session, a_records: str, b_records: str, b_attempt: int) -> None:
    """Run until resume-a holds in its turn-2 tool and resume-b's turn-3 call is held, then SIGKILL the run."""
    tasks = s.run_dir / "tasks"

    def held() -> bool:
        return (
            (s.gate / "resume-a.held").exists()
            and s.emulator._app.attempts[("resume-b", "main", 3)] >= b_attempt
            and (tasks / "resume-c" / "result.json").exists()
            and call_saved(tasks / a_records, 2)
            and call_saved(tasks / b_records, 2)
        )

    kill_when(s, held)
    assert not (tasks / "resume-a" / "result.json").exists() and not (tasks / "resume-b" / "result.json").exists()


def results(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Every result.json (tasks and epochs) by its path in the run, without the resume's own keys."""
    found = {}
    for path in sorted((run_dir / "tasks").rglob("result.json")):
        data = json.loads(path.read_bytes())
        found[str(path.relative_to(run_dir))] = {k: v for k, v in data.items() if k not in RESUME_KEYS}
    return found


def resumed_turns(run_dir: Path, task: str) -> int:
    return TaskResult.from_dict(json.loads((run_dir / "tasks" / task / "result.json").read_bytes())).resumed_turns


def check_resumed(reference: Session, killed: Session, *, turns: dict[str, int]) -> RunSummary:
    """The resumed run's results are the uninterrupted run's, and every model call was answered once."""
    assert results(killed.run_dir) == results(reference.run_dir)
    assert killed.answered() == reference.answered()  # no turn sent twice (the held one was never answered)
    assert {t: resumed_turns(killed.run_dir, t) for t in TASKS} == turns
    assert not (killed.run_dir / ".resume").exists()  # the moved-aside turns are back in the task folders
    summary = RunSummary.from_dict(json.loads((killed.run_dir / "summary.json").read_bytes()))
    assert summary.resumed_turns == sum(turns.values()) and summary.resumed_tasks == 2
    return summary


def test_a_killed_run_resumes_inside_its_tasks(sessions: Sessions, reference: Session) -> None:
    killed = sessions("killed", faults=held_call(1))
    kill_mid_task(killed, "resume-a", "resume-b", 1)
    killed.run()
    summary = check_resumed(reference, killed, turns={"resume-a": 2, "resume-b": 2, "resume-c": 0})
    assert summary.resumed == 1 and summary.completed == summary.correct == 3
    # The auditor accepts the resumed run and finds its resumed turns in the ledger.
    verified = run_app(["verify", str(killed.run_dir)], cwd=ROOT, env=dict(os.environ), timeout=300)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # A resumed-turn count the evidence does not back is named.
    result = killed.run_dir / "tasks" / "resume-a" / "result.json"
    result.write_text(result.read_text().replace('"resumed_turns": 2', '"resumed_turns": 9'))
    verified = run_app(["verify", str(killed.run_dir)], cwd=ROOT, env=dict(os.environ), timeout=300)
    assert verified.returncode != 0 and "resumed_turns: the run says 9, the evidence gives 'at most 3'" in (
        verified.stdout + verified.stderr
    )


def test_each_epoch_resumes_inside_itself_with_two_workers(sessions: Sessions) -> None:
    epochs = "experiment.epochs=2"
    reference = sessions("reference-epochs", epochs)
    reference.run()
    # resume-a is held in its first epoch; resume-b in its second (its first epoch's turn 3 passed).
    killed = sessions("killed-epochs", epochs, "experiment.workers=2", faults=held_call(2))
    kill_mid_task(killed, "resume-a/epochs/1", "resume-b/epochs/2", 2)
    killed.run()
    check_resumed(reference, killed, turns={"resume-a": 2, "resume-b": 2, "resume-c": 0})


def live_provider(folder: Path, emulator: Emulator) -> str:
    """A provider folder (``provider.config_dir``) naming ``live``: the offline provider at ``emulator``."""
    folder.mkdir()
    shutil.copy(ROOT / "flowllm" / "conf" / "provider" / "offline.yaml", folder)
    live = {"defaults": ["offline", "_self_"], "name": "live", "emulator_script": None, "base_url": emulator.base_url}
    (folder / "live.yaml").write_text(json.dumps(live))
    return f"provider.config_dir={folder}"


def test_a_killed_fork_resumes_its_live_turns_without_paying_them_again(sessions: Sessions, reference: Session) -> None:
    fork = ("provider=replay", f"provider.run_dir={reference.run_dir}", "provider.fork=live", "provider.live=live")
    fork += ("provider.fork_at_turn=2",)
    uninterrupted = sessions("fork", *fork)
    uninterrupted.extra += (live_provider(sessions.root / "fork-providers", uninterrupted.emulator),)
    uninterrupted.run()
    killed = sessions("killed-fork", *fork, faults=held_call(1))
    killed.extra += (live_provider(sessions.root / "killed-fork-providers", killed.emulator),)
    kill_mid_task(killed, "resume-a", "resume-b", 1)
    killed.run()
    check_resumed(uninterrupted, killed, turns={"resume-a": 2, "resume-b": 2, "resume-c": 0})
    verdict = json.loads((killed.run_dir / "tasks" / "resume-a" / "result.json").read_bytes())["replay"]
    assert verdict["status"] == "forked" and verdict["turn"] == 2 and verdict["live_calls"] == 2


def test_tasks_the_budget_stopped_resume_inside_when_the_rerun_raises_it(
    sessions: Sessions, reference: Session
) -> None:
    stopped = sessions("budget", "experiment.budget.cost_usd=0.002")  # below one call: every task stops early
    done = run_flowllm(*stopped.args(), env=stopped.env, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    tasks = stopped.run_dir / "tasks"
    assert {json.loads(p.read_bytes())["status"] for p in tasks.glob("*/result.json")} == {"budget"}
    saved = {t: len(list((tasks / t).glob("turn_*"))) for t in TASKS}
    stopped.extra = ("experiment.budget.cost_usd=1.0",)
    stopped.run()
    assert results(stopped.run_dir) == results(reference.run_dir)
    assert stopped.answered() == reference.answered()
    assert {t: resumed_turns(stopped.run_dir, t) for t in TASKS} == saved and min(saved.values()) >= 1


@dataclass
class OwnDataset(Session):
    """A session over a dataset of its own (the resume tasks with other ground truths)."""

    dataset: Path = RESUME

    def args(self) -> list[str]:
        return [f"dataset.path={self.dataset}" if a.startswith("dataset.path=") else a for a in super().args()]


def test_each_attempt_of_pass_at_k_resumes_from_its_own_turns(sessions: Sessions) -> None:
    """resume-b answers wrong (its ground truth is changed here), so pass@2 runs it twice; the run is killed in
    its second attempt. The rerun serves the first attempt's turns and the second's saved ones: nothing is sent
    twice, and the results are the uninterrupted run's."""
    data = sessions.root / "wrong-b"
    shutil.copytree(RESUME, data)
    rows = [json.loads(line) for line in (RESUME / "metadata.jsonl").read_text().splitlines()]
    rows = [{**row, "Final answer": "never"} if row["task_id"] == "resume-b" else row for row in rows]
    (data / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    def session(name: str, faults: FaultPlan | None = None) -> OwnDataset:
        made = sessions(name, "experiment.attempts=2", faults=faults)
        return OwnDataset(made.run_dir, made.emulator, made.gate, made.extra, dataset=data)

    reference = session("reference-k")
    reference.run()
    saved_b = TaskResult.from_dict(json.loads((reference.run_dir / "tasks" / "resume-b" / "result.json").read_bytes()))
    assert (saved_b.attempts, saved_b.correct) == (2, False)
    killed = session("killed-k", held_call(2))  # resume-b's second attempt is held in its turn-3 call
    kill_mid_task(killed, "resume-a", "resume-b", 2)
    assert (killed.run_dir / "tasks" / "resume-b" / "attempts" / "1").is_dir()
    killed.run()
    # resume-b: its first attempt's four calls and its second's first two answered from the saved turns
    check_resumed(reference, killed, turns={"resume-a": 2, "resume-b": 6, "resume-c": 0})
    verified = run_app(["verify", str(killed.run_dir)], cwd=ROOT, env=dict(os.environ), timeout=300)
    assert verified.returncode == 0, verified.stdout + verified.stderr
