"""The app as a user runs it, stopped the hard ways: Ctrl-C (SIGINT) and SIGKILL, then resumed.

The slow fixture's tasks each call the test's sleep server. The stop tests let the first tasks finish and hold
the others in their tool call while the test's gate is closed (``gated``), so a signal sent once the first
results are written lands while the others are in flight, however slow the machine.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from flowllm.cli.ctl import main as ctl_main
from flowllm.engine.recorder import read_json
from tests.experiment.helpers import ROOT, SLOW, TEST_CONF, run_flowllm, start_flowllm

ALL_TASKS = [f"slow-{i:02d}" for i in range(1, 7)]  # the first six of the fixture


def _wait(arguments: dict[str, object]) -> dict[str, str]:
    return {
        "text": "<use_mcp_tool>\n<server_name>tool-sleep</server_name>\n<tool_name>wait</tool_name>\n"
        f"<arguments>\n{json.dumps(arguments)}\n</arguments>\n</use_mcp_tool>"
    }


def gated(run_dir: Path, gate: Path, quick: int, *extra: str) -> tuple[list[str], dict[str, str]]:
    """Arguments and environment of a run of the slow fixture whose first ``quick`` tasks answer at once and
    whose others wait in their tool call while ``gate/closed`` exists (the sleep server's ``hold``)."""
    gate.mkdir(exist_ok=True)
    (gate / "closed").write_text("")
    answer = {"text": "\\boxed{${last_tool_result}}"}
    script = {
        "default": [_wait({"seconds": 0, "hold": "held"}), answer],
        "tasks": {task: [_wait({"seconds": 0}), answer] for task in ALL_TASKS[:quick]},
    }
    (gate.parent / "script.yaml").write_text(json.dumps(script))  # JSON is YAML
    args = slow_args(run_dir, *extra, script=gate.parent / "script.yaml", tools="gated")
    return args, {"SLEEP_GATE": str(gate)}


def slow_args(run_dir: Path, *extra: str, script: Path = SLOW / "script.yaml", tools: str = "sleep") -> list[str]:
    return [
        "progress=false",
        f"dataset.path={SLOW}",
        f"provider.emulator_script={script}",
        # The test tool sets: a sleep server that starts in milliseconds (data/slow/sleep_server.py).
        f"hydra.searchpath=[file://{TEST_CONF}]",
        f"tools={tools}",
        "experiment.max_concurrent=2",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def completed(run_dir: Path) -> dict[str, bytes]:
    """Task id -> result.json bytes, for the tasks whose result says completed."""
    found = {}
    for path in (run_dir / "tasks").glob("*/result.json"):
        data = path.read_bytes()
        if json.loads(data)["status"] == "completed":
            found[path.parent.name] = data
    return found


def wait_for_results(proc: subprocess.Popen, run_dir: Path, count: int, log: Path, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while len(completed(run_dir)) < count:
        assert proc.poll() is None, f"the run ended before {count} results:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {count} results in {limit_s}s:\n{log.read_text()}"
        time.sleep(0.05)


def test_ctrl_c_cancels_running_tasks_and_saves_the_rest(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "log.txt"
    args, env = gated(run_dir, tmp_path / "gate", 1, "dataset.limit=4")
    proc = start_flowllm(*args, log=log, env=env)
    try:
        wait_for_results(proc, run_dir, 1, log)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert code == 130, output
    assert "Traceback" not in output
    summary = read_json(run_dir / "summary.json")
    assert summary["interrupted"] is True and summary["status"] == "interrupted"
    assert "interrupted" in output and "rerun with the same hydra.run.dir" in output
    done = completed(run_dir)
    # Everything that finished is in the summary; what was cancelled left no result and counts as unfinished.
    assert summary["finished"] == len(list((run_dir / "tasks").glob("*/result.json"))) == 1
    assert summary["completed"] == len(done) == 1 and summary["unfinished"] == 3


def test_sigkill_mid_run_resumes_without_losing_or_repeating_a_task(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "log.txt"
    gate = tmp_path / "gate"
    args, env = gated(run_dir, gate, 2, "dataset.limit=6")
    proc = start_flowllm(*args, log=log, env=env)
    try:
        wait_for_results(proc, run_dir, 2, log)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    survived = completed(run_dir)
    assert sorted(survived) == ALL_TASKS[:2], "the kill lands while the others are held"
    assert not (run_dir / "summary.json").exists()
    mtimes = {t: (run_dir / "tasks" / t / "result.json").stat().st_mtime_ns for t in survived}

    (gate / "closed").unlink()  # the rerun's calls are not held
    again = run_flowllm(*args, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    summary = read_json(run_dir / "summary.json")
    assert summary["tasks"] == summary["completed"] == summary["correct"] == len(ALL_TASKS)
    assert summary["resumed"] == len(survived) and summary["interrupted"] is False
    # Not lost: every task has exactly one completed result. Not repeated: results that survived the kill
    # are byte-for-byte the same files, untouched by the rerun.
    assert sorted(completed(run_dir)) == ALL_TASKS
    for task_id, data in survived.items():
        path = run_dir / "tasks" / task_id / "result.json"
        assert path.read_bytes() == data and path.stat().st_mtime_ns == mtimes[task_id]
    for task_id in ALL_TASKS:
        task_dir = run_dir / "tasks" / task_id
        result = read_json(task_dir / "result.json")
        # The records match the result: no turn of the killed attempt is left beside the new ones.
        assert len(list(task_dir.glob("turn_*"))) == result["turns"] == 2, task_id
        assert not list(task_dir.rglob(".*.tmp")), task_id
    # The usage of the whole run is that of 6 tasks once each (the quick tasks' conversations are identical, and
    # so are the held ones').
    per_task = [read_json(run_dir / "tasks" / t / "result.json")["usage"]["output_tokens"] for t in ALL_TASKS]
    assert len(set(per_task[:2])) == len(set(per_task[2:])) == 1
    assert summary["usage"]["output_tokens"] == sum(per_task)


def start_gated(
    tmp_path: Path, stdout: int | IO[str], stderr: IO[str], sigint: Callable[[], None], *extra: str
) -> subprocess.Popen[bytes]:
    """``python -m flowllm`` on four tasks of the gated slow fixture (the first answers at once) into
    ``tmp_path/run``, in a plain process whose SIGINT ``sigint`` sets up before it starts."""
    args, env = gated(tmp_path / "run", tmp_path / "gate", 1, "dataset.limit=4", *extra)
    command = [sys.executable, "-m", "flowllm", *args]
    env = {**os.environ, **env}
    return subprocess.Popen(command, cwd=ROOT, stdout=stdout, stderr=stderr, env=env, preexec_fn=sigint)


def _interruptible() -> None:
    """In the app's process before it starts: SIGINT as a terminal delivers it, not ignored or blocked. A process
    inherits both from its parent (a test worker whose earlier tests left SIGINT so, or a suite started in the
    background by a script), and Python keeps an ignored SIGINT ignored; ``tests/appfork.py`` resets it too."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_under_a_pipe_whose_reader_is_gone_exits_130_and_writes_the_table_to_stderr(tmp_path: Path) -> None:
    # `python -m flowllm ... 2>err | tee out`: the terminal's Ctrl-C stops tee too, so stdout has no reader.
    run_dir = tmp_path / "run"
    log = tmp_path / "err.txt"
    with log.open("w") as err:
        proc = start_gated(tmp_path, subprocess.PIPE, err, _interruptible)
    try:
        wait_for_results(proc, run_dir, 1, log)
        assert proc.stdout is not None
        proc.stdout.close()  # the reader has gone: the table's write meets a closed pipe
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert code == 130, output
    assert "Traceback" not in output and "BrokenPipeError" not in output
    assert read_json(run_dir / "summary.json")["interrupted"] is True
    assert "run directory" in output and "interrupted" in output  # the final table, on stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_started_with_sigint_ignored_still_stops_on_it(tmp_path: Path, workers: int) -> None:
    """A script's background job (``python -m flowllm ... &``) starts with SIGINT ignored. The run still stops on
    it, as one process or as workers: ``flowllm ctl stop`` stops the run with SIGINT, and must not answer ok and
    let it run on (the one-process run did, before it handled an inherited ignored SIGINT)."""
    run_dir = tmp_path / "run"
    log = tmp_path / "err.txt"
    with log.open("w") as err:
        proc = start_gated(tmp_path, err, err, _ignoring_sigint, f"experiment.workers={workers}")
    try:
        wait_for_results(proc, run_dir, 1, log)
        with contextlib.redirect_stdout(io.StringIO()) as said:
            assert ctl_main([str(run_dir), "stop", "--json"]) == 0
        assert json.loads(said.getvalue())["ok"] is True
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, log.read_text()
    summary = read_json(run_dir / "summary.json")
    assert summary["interrupted"] is True and summary["finished"] == 1 and summary["unfinished"] == 3


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
