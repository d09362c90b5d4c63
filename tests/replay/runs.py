"""Real runs for the replay and inspect tests, made once per test session with the real app.

Two tasks of the bundled sample keep them small and still cover what matters:

* ``sample-01-csv-revenue`` (level 1): its Python call has raw newlines and unescaped quotes inside the JSON
  string, so only the ``lenient`` repair stage reads it (``repair=strict`` fails it);
* ``sample-07-department`` (level 2): clean JSON, read by the ``strict`` stage under every repair config.

``python -m flowllm`` runs as a subprocess (it is what users run, and it writes ``.hydra/config.yaml``, which
replay needs). Replays run two at a time (this machine kind has two cores: more at once only makes each slower).
The timeout is a hang guard, not a speed target: a loaded machine may take minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from flowllm.engine.recorder import read_json
from tests.appfork import run_app

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LENIENT_TASK = "sample-01-csv-revenue"
CLEAN_TASK = "sample-07-department"
TASKS = (LENIENT_TASK, CLEAN_TASK)
TASK_OVERRIDE = f"dataset.task_ids=[{','.join(TASKS)}]"
# Both tasks only use run_python: the other tool servers would only cost start-up time in every run.
ONLY_PYTHON_TOOL = ("~tools.servers.tool-files", "~tools.servers.tool-math")
RUNNERS = ("legacy", "graph", "graph_parallel")
RUN_TIMEOUT_S = 1800
AT_ONCE = 2


@dataclass(frozen=True)
class Finished:
    run_dir: Path
    returncode: int
    stdout: str
    stderr: str

    def check(self, expected: int = 0) -> Finished:
        """The run ended with ``expected`` (0: every task completed; 3: some failed, see flowllm/exit_codes.py)."""
        assert self.returncode == expected, f"flowllm exited {self.returncode}:\n{self.stderr[-3000:]}"
        return self

    def result(self, task_id: str) -> dict:
        return read_json(self.run_dir / "tasks" / task_id / "result.json")

    @property
    def app_log(self) -> str:
        path = self.run_dir / "app.log"
        return path.read_text(encoding="utf-8") if path.is_file() else ""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PROJECT_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("COLUMNS", "160")
    return env


def run_flowllm(run_dir: Path, *overrides: str) -> Finished:
    args = [f"hydra.run.dir={run_dir}", "progress=false", *overrides]
    try:
        done = run_app(args, cwd=PROJECT_ROOT, env=_env(), timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return Finished(run_dir, -9, str(exc.output or ""), str(exc.stderr or ""))
    return Finished(run_dir, done.returncode, done.stdout, done.stderr)


def run_all(jobs: dict[str, tuple[Path, tuple[str, ...]]]) -> dict[str, Finished]:
    """Runs (a name: its folder and overrides), ``AT_ONCE`` at a time."""
    with ThreadPoolExecutor(AT_ONCE) as pool:
        started = {name: pool.submit(run_flowllm, folder, *args) for name, (folder, args) in jobs.items()}
        return {name: future.result() for name, future in started.items()}


@dataclass(frozen=True)
class FixtureRuns:
    original: Finished
    replays: dict[str, Finished]  # runner name -> replay of the original with that runner
    strict: Finished  # replay with repair=strict
    missing_turn: Finished  # replay of a copy whose LENIENT_TASK lost its turn 2
    truncated_copy: Path  # that copy
    no_run_dir: Finished  # provider=replay with provider.run_dir missing


_lock = threading.Lock()
_cache: dict[Path, FixtureRuns] = {}


def fixture_runs(base: Path) -> FixtureRuns:
    """Make (once per session and base folder) the original run and its replays."""
    with _lock:
        if base in _cache:
            return _cache[base]
        original = run_flowllm(base / "original", TASK_OVERRIDE, *ONLY_PYTHON_TOOL).check()
        truncated = base / "truncated"
        shutil.copytree(original.run_dir, truncated, ignore=shutil.ignore_patterns("workspace", "report.html"))
        shutil.rmtree(truncated / "tasks" / LENIENT_TASK / "turn_002")
        replay = ("provider=replay", f"provider.run_dir={original.run_dir}", TASK_OVERRIDE, *ONLY_PYTHON_TOOL)
        jobs = {f"runner-{r}": (base / f"replay-{r}", (*replay, f"runner={r}")) for r in RUNNERS}
        jobs["strict"] = (base / "replay-strict", (*replay, "repair=strict"))
        # No tools: this run only has to show that a missing turn fails its task and no other.
        jobs["missing"] = (
            base / "replay-missing",
            ("provider=replay", f"provider.run_dir={truncated}", TASK_OVERRIDE, "tools=none"),
        )
        # provider=replay without provider.run_dir: must be refused with one line before any task starts.
        jobs["no-run-dir"] = (base / "replay-no-run-dir", ("provider=replay", TASK_OVERRIDE))
        done = run_all(jobs)
        runs = FixtureRuns(
            original=original,
            replays={r: done[f"runner-{r}"] for r in RUNNERS},
            strict=done["strict"],
            missing_turn=done["missing"],
            truncated_copy=truncated,
            no_run_dir=done["no-run-dir"],
        )
        _cache[base] = runs
        return runs
