"""``experiment.workers=N``: one run over N worker processes, as a user runs it (``python -m flowllm``).

The same results as one process, file by file (timings aside); Ctrl-C, SIGKILL and resume as with one process;
pass@k; bad values refused with one line; each worker's share of the rate limits; the shared ledger's lines
never interleave between processes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from flowllm.config.provider_schema import ProviderConfig, RateLimitConfig
from flowllm.engine.recorder import read_json
from flowllm.errors import ConfigError
from flowllm.experiment.workers import (
    MAX_WORKERS,
    check_in_flight,
    deal,
    resolve_workers,
    share,
    share_rate_limit,
)
from flowllm.providers import UsageLedger
from flowllm.providers.registry import ProviderTable
from tests.appfork import start_app
from tests.experiment.helpers import (
    GAIA,
    ONLY_PYTHON_TOOL,
    ROOT,
    SLOW,
    TEST_CONF,
    WRONG_TASK,
    gaia_overrides,
    run_flowllm,
    start_flowllm,
)
from tests.experiment.test_interrupts import completed, wait_for_results

pytestmark = pytest.mark.long

SLOW_TASKS = [f"slow-{i:02d}" for i in range(1, 7)]
HANG_GUARD_S = 600  # only against a hang: the suite runs on loaded machines
# Files whose content holds timings (or the run's own config and log): compared apart, not byte for byte.
TIMED = {"summary.json", "usage.jsonl", "meta.json", "app.log", "timing.json", "history.jsonl"}


def slow_args(run_dir: Path, *extra: str) -> list[str]:
    return [
        "progress=false",
        f"dataset.path={SLOW}",
        f"provider.emulator_script={SLOW / 'script.yaml'}",
        f"hydra.searchpath=[file://{TEST_CONF}]",
        "tools=sleep",
        "experiment.max_concurrent=2",  # two workers of one task each: the kill lands mid-run
        "dataset.limit=6",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def without_timings(result: dict[str, Any]) -> dict[str, Any]:
    result = {k: v for k, v in result.items() if k != "wall_seconds"}
    result["attempt_log"] = [{k: v for k, v in e.items() if k != "wall_seconds"} for e in result["attempt_log"]]
    return result


def summary_figures(summary: dict[str, Any]) -> dict[str, Any]:
    # `tools.unavailable` is known to the workers, not to their parent, which says so (None, never {}).
    figures = {k: v for k, v in summary.items() if k not in ("wall_seconds", "providers", "tools")}
    providers = summary["providers"]
    figures["providers"] = {k: v for k, v in providers.items() if not k.startswith("latency") and k != "hourly"}
    for block in ("by_provider", "by_model", "by_agent"):
        figures["providers"][block] = {
            name: {k: v for k, v in tally.items() if not k.startswith("latency")}
            for name, tally in providers[block].items()
        }
    return figures


def ledger_attempts(run_dir: Path) -> list[tuple[Any, ...]]:
    """The ledger's attempts without their timings or per-process call numbers, in a fixed order."""
    lines = UsageLedger.read(run_dir / "usage.jsonl").attempts()
    return sorted(
        (a["task_id"], a["turn"], a["attempt"], a["agent"], a["outcome"], json.dumps(a["usage"]), a["cost_usd"])
        for a in lines
    )


def assert_same_runs(first: Path, second: Path) -> None:
    """Two runs of the same tasks left the same files, byte for byte but for timings, and the same figures."""
    assert run_files(first) == run_files(second)
    for name in run_files(first):
        path = Path(name)
        if path.name in TIMED:
            continue
        if path.name == "result.json":
            assert without_timings(read_json(first / path)) == without_timings(read_json(second / path)), name
        else:
            assert (first / path).read_bytes() == (second / path).read_bytes(), name
    assert summary_figures(read_json(first / "summary.json")) == summary_figures(read_json(second / "summary.json"))
    assert ledger_attempts(first) == ledger_attempts(second)


def run_files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and ".hydra" not in p.parts)


def worker_pids(run_dir: Path) -> list[int]:
    """Processes whose command line names this run's folder (the parent and its workers)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(run_dir) in cmdline and "worker_shard" in cmdline:
            pids.append(int(proc.name))
    return pids


def wait_until_gone(run_dir: Path) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while worker_pids(run_dir):
        assert time.monotonic() < deadline, f"workers outlived their parent: {worker_pids(run_dir)}"
        time.sleep(0.2)


def task_rows(table: str) -> set[str]:
    """The rows of a run's printed task table (its cells, each task's tokens and cost among them)."""
    return {line for line in table.splitlines() if line.startswith("│ ") and "│ run directory" not in line}


def test_two_workers_give_the_same_results_as_one_with_pass_at_k(tmp_path: Path) -> None:
    def one(workers: int) -> tuple[Path, str]:
        run_dir = tmp_path / f"w{workers}"
        proc = run_flowllm(
            *gaia_overrides(
                f"experiment.workers={workers}", "experiment.attempts=2", f"hydra.run.dir={run_dir}", *ONLY_PYTHON_TOOL
            ),
            timeout=HANG_GUARD_S,
        )
        # The fixture has a task whose attachment is missing: some tasks failed, exit 3, with one worker or two.
        assert proc.returncode == 3, proc.stdout + proc.stderr
        return run_dir, proc.stdout

    with ThreadPoolExecutor(2) as pool:
        (single, single_table), (double, double_table) = pool.map(one, (1, 2))
    assert_same_runs(single, double)
    # The same task table too: each task's billed tokens and cost, read from the ledger the workers shared.
    rows = {row for row in task_rows(single_table) if "$0." in row}
    assert len(rows) >= 4 and rows <= task_rows(double_table)
    # pass@k under two workers: the wrong answer was tried twice, its first attempt kept aside.
    wrong = read_json(double / "tasks" / WRONG_TASK / "result.json")
    assert wrong["attempts"] == 2 and [e["attempt"] for e in wrong["attempt_log"]] == [1, 2]
    assert (double / "tasks" / WRONG_TASK / "attempts" / "1").is_dir()
    summary = read_json(double / "summary.json")
    # The workers started and probed their own tool servers: the parent does not know, and says so.
    assert summary["tools"] == {"unavailable": None, "sandbox_gaps": None, "start_s": None}
    assert summary["status"] == "finished" and summary["tasks"] == summary["finished"] == 5
    assert "Traceback" not in (double / "app.log").read_text()


def test_sigkill_of_the_parent_takes_the_workers_and_a_rerun_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "log.txt"
    proc = start_flowllm(*slow_args(run_dir, "experiment.workers=2"), log=log)
    try:
        wait_for_results(proc, run_dir, 2, log, limit_s=HANG_GUARD_S)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_until_gone(run_dir)  # the workers died with their parent: none writes on behind a rerun
    survived = completed(run_dir)
    assert 2 <= len(survived) <= len(SLOW_TASKS)
    assert not (run_dir / "summary.json").exists()
    # What the parent handed its workers is in the run's folder (no stray folder in /tmp), until a rerun ends.
    assert sorted(p.name for p in (run_dir / ".control" / "shards").iterdir()) == ["shard-0.json", "shard-1.json"]
    mtimes = {t: (run_dir / "tasks" / t / "result.json").stat().st_mtime_ns for t in survived}

    again = run_flowllm(*slow_args(run_dir, "experiment.workers=2"), timeout=HANG_GUARD_S)
    assert again.returncode == 0, again.stdout + again.stderr
    summary = read_json(run_dir / "summary.json")
    assert summary["tasks"] == summary["completed"] == summary["correct"] == len(SLOW_TASKS)
    assert summary["resumed"] == len(survived) and summary["interrupted"] is False
    assert sorted(completed(run_dir)) == SLOW_TASKS
    assert not (run_dir / ".control").exists()
    for task_id, data in survived.items():  # not repeated: the survivors are untouched
        path = run_dir / "tasks" / task_id / "result.json"
        assert path.read_bytes() == data and path.stat().st_mtime_ns == mtimes[task_id]
    for task_id in SLOW_TASKS:  # not lost, and no turn of a killed attempt beside the new ones
        task_dir = run_dir / "tasks" / task_id
        assert len(list(task_dir.glob("turn_*"))) == read_json(task_dir / "result.json")["turns"] == 2, task_id
        assert not list(task_dir.rglob(".*.tmp")), task_id


def test_ctrl_c_interrupts_every_worker_and_keeps_what_finished(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "log.txt"
    proc = start_flowllm(*slow_args(run_dir, "experiment.workers=2"), log=log)
    try:
        wait_for_results(proc, run_dir, 1, log, limit_s=HANG_GUARD_S)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert code == 130, output
    assert "Traceback" not in output
    assert not worker_pids(run_dir)  # the parent waited for its workers
    summary = read_json(run_dir / "summary.json")
    assert summary["interrupted"] is True and summary["status"] == "interrupted"
    assert "rerun with the same hydra.run.dir" in output
    results = list((run_dir / "tasks").glob("*/result.json"))
    assert summary["finished"] == len(results) >= 1
    assert summary["completed"] == len(completed(run_dir))
    assert summary["finished"] + summary["unfinished"] == len(SLOW_TASKS)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_whose_stdout_has_no_reader_exits_with_its_own_code(tmp_path: Path, workers: int) -> None:
    """``python -m flowllm ... | head -1``: the reader is gone when the table is printed. That is no failure of the
    run: the table goes to stderr and the exit code is the run's (a workers' parent exited 1, a bug's code)."""
    run_dir = tmp_path / "run"
    log = tmp_path / "err.txt"
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read what the run prints
    args = ["progress=false", "dataset.limit=2", f"experiment.workers={workers}", f"hydra.run.dir={run_dir}"]
    try:
        with log.open("w") as err:
            proc = start_app(args, cwd=ROOT, env=dict(os.environ), stdout=write_end, stderr=err.fileno())
    finally:
        os.close(write_end)
    code = proc.wait(timeout=HANG_GUARD_S)
    output = log.read_text()
    assert code == 0, output
    assert "Traceback" not in output and "BrokenPipeError" not in output
    assert read_json(run_dir / "summary.json")["completed"] == 2
    assert "run directory" in output and "$0." in output  # the tables, on stderr, each task's cost in its row


def test_a_worker_that_dies_after_tasks_ran_exits_with_the_tasks_code_not_2(tmp_path: Path) -> None:
    # A run error after tasks ran (flowllm.errors.RunStopped) is not "nothing ran": 3 when some completed.
    run_dir = tmp_path / "run"
    log = tmp_path / "log.txt"
    proc = start_flowllm(*slow_args(run_dir, "experiment.workers=2"), log=log)
    try:
        wait_for_results(proc, run_dir, 1, log, limit_s=HANG_GUARD_S)
        os.kill(worker_pids(run_dir)[0], signal.SIGKILL)
        code = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "failed" and "exited with code -9" in summary["error"]
    assert summary["completed"] >= 1 and code == 3, output  # the stopped run counts as failed tasks, never 2
    assert "exited with code -9" in output and "Traceback" not in output


def test_a_bad_workers_value_is_one_line_before_any_task(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_flowllm(*gaia_overrides("experiment.workers=0", f"hydra.run.dir={run_dir}"), timeout=HANG_GUARD_S)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"flowllm: error: experiment.workers must be auto or a whole number from 1 to {MAX_WORKERS}, not 0"
    ]
    assert not (run_dir / "tasks").exists()


@pytest.mark.parametrize("value", [0, -1, MAX_WORKERS + 1, 2.5, "two", "", True, None])
def test_workers_values_outside_the_range_are_refused(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"experiment\.workers must be auto or a whole number") as info:
        resolve_workers(value)
    assert "\n" not in str(info.value)


def test_workers_values_that_work() -> None:
    assert [resolve_workers(v) for v in (1, 2, MAX_WORKERS)] == [1, 2, MAX_WORKERS]
    assert resolve_workers("auto") == min(MAX_WORKERS, len(os.sched_getaffinity(0)))


def test_shards_are_dealt_round_robin_in_dataset_order() -> None:
    assert deal(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    dealt = [task for shard in deal([str(i) for i in range(17)], 4) for task in shard]
    assert sorted(dealt) == sorted(str(i) for i in range(17))


def test_each_worker_gets_its_share_of_the_rate_limits() -> None:
    limit = RateLimitConfig(requests_per_minute=120, tokens_per_minute=90_000, max_in_flight=5)
    shares = [share_rate_limit(limit, i, 2) for i in range(2)]
    assert [s.requests_per_minute for s in shares] == [60.0, 60.0]
    assert [s.tokens_per_minute for s in shares] == [45_000.0, 45_000.0]
    assert [s.max_in_flight for s in shares] == [3, 2]  # adds up to the run's limit
    assert share_rate_limit(RateLimitConfig(), 0, 4) == RateLimitConfig()
    assert [share(10, i, 4) for i in range(4)] == [3, 3, 2, 2]


def test_a_max_in_flight_below_the_worker_count_is_refused() -> None:
    cfg = ProviderConfig(
        name="offline",
        model="m",
        emulator_script=str(GAIA / "script.yaml"),
        rate_limit=RateLimitConfig(max_in_flight=1),
    )
    with pytest.raises(ConfigError, match=r"max_in_flight=1 cannot be shared by experiment\.workers=2"):
        check_in_flight(cfg, ProviderTable(), 2)
    check_in_flight(cfg, ProviderTable(), 1)


def _append(path: str, marker: int, count: int) -> None:
    ledger = UsageLedger(path)
    for i in range(count):
        # Small lines and lines larger than the file buffer (8 KiB): both must land as whole lines.
        ledger.write({"type": "probe", "worker": marker, "n": i, "pad": "x" * (20_000 if i % 3 == 0 else 10)})
    ledger.close()


def test_ledger_lines_of_several_processes_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_append, args=(str(path), w, 300)) for w in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(HANG_GUARD_S)
        assert proc.exitcode == 0
    lines = UsageLedger.read(path).lines  # raises on a torn line
    probes = sorted((line.extra["worker"], line.extra["n"]) for line in lines)  # keys a ledger line does not know
    assert probes == [(w, i) for w in range(3) for i in range(300)]
