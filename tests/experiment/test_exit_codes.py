"""Exit codes through the real command line: scripts and CI can tell a clean run from failed tasks."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flowllm.cli.sweep_check import baseline_problem
from flowllm.engine.recorder import read_json
from flowllm.exit_codes import ExitCode, run_exit_code, sweep_exit_code
from tests.experiment.helpers import LIST_TASK, MISSING_FILE_TASK, WRONG_TASK, gaia_overrides, run_flowllm

COUNTED_SERVER = Path(__file__).parents[1] / "tools" / "servers" / "counted_server.py"


def _run(run_dir: Path, *ids: str) -> tuple[int, str]:
    proc = run_flowllm(*gaia_overrides("tools=none", f"hydra.run.dir={run_dir}", f"dataset.task_ids=[{','.join(ids)}]"))
    return proc.returncode, proc.stdout + proc.stderr


def test_run_exit_codes_tell_failed_tasks_from_wrong_answers(tmp_path: Path) -> None:
    cases = {
        "wrong": ((WRONG_TASK,), ExitCode.OK),  # a wrong answer completed: not a failure
        "wrong-again": ((WRONG_TASK,), ExitCode.OK),
        "some": ((LIST_TASK, MISSING_FILE_TASK), ExitCode.SOME_FAILED),
        "all": ((MISSING_FILE_TASK,), ExitCode.ALL_FAILED),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        done = {name: pool.submit(_run, tmp_path / name, *ids) for name, (ids, _) in cases.items()}
    for name, (_, expected) in cases.items():
        code, output = done[name].result()
        assert code == expected, f"{name}: exit {code}\n{output[-2000:]}"
        summary = read_json(tmp_path / name / "summary.json")
        assert run_exit_code(summary) == expected
    # Two identical runs: result.json is byte-identical (timings live in timing.json beside it), so diff -r works.
    first, second = (tmp_path / run / "tasks" / WRONG_TASK for run in ("wrong", "wrong-again"))
    assert (first / "result.json").read_bytes() == (second / "result.json").read_bytes()
    assert "wall_seconds" not in read_json(first / "result.json")
    assert read_json(first / "timing.json")["wall_seconds"] > 0


def test_a_config_error_exits_2_with_one_line(tmp_path: Path) -> None:
    proc = run_flowllm(*gaia_overrides(f"hydra.run.dir={tmp_path}", "dataset.path=/nonexistent/flowllm-data"))
    assert proc.returncode == ExitCode.CONFIG
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("flowllm: error")]


def test_a_sweep_with_an_errored_job_exits_non_zero(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    common = gaia_overrides("tools=none", f"dataset.task_ids=[{LIST_TASK}]")
    # Job 1's folder already holds a result of other settings: that job is refused when it starts, the first runs.
    # (The whole-sweep check would refuse the sweep before job 0: HYDRA_FULL_ERROR=1 skips it, as for Hydra's own
    # errors, so the job's own refusal is what decides here.)
    first = run_flowllm(*common, f"hydra.run.dir={sweep_dir / '1'}", "repair=strict", timeout=240)
    assert first.returncode == 0, first.stderr[-2000:]
    unchecked = {"HYDRA_FULL_ERROR": "1"}
    proc = run_flowllm("-m", *common, f"hydra.sweep.dir={sweep_dir}", "agent.max_turns=5,6", env=unchecked, timeout=240)
    assert proc.returncode == ExitCode.SWEEP_JOB_ERROR, proc.stdout[-2000:] + proc.stderr[-2000:]
    statuses = [job["status"] for job in read_json(sweep_dir / "sweep_summary.json")["jobs"]]
    assert statuses == ["ok", "error"]


def test_a_sweep_is_checked_as_a_whole_before_its_first_job(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = run_flowllm(
        "-m",
        "progress=false",
        f"hydra.sweep.dir={sweep_dir}",
        "provider=offline,claude",
        "experiment.attempts=1,0",
        env={"ANTHROPIC_API_KEY": ""},
        timeout=240,
    )
    assert proc.returncode == ExitCode.CONFIG, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, lines  # each problem once, naming the jobs it stops
    assert lines[0] == (
        "flowllm: error: experiment.attempts must be at least 1, not 0 "
        "(jobs 1 (provider=offline experiment.attempts=0), 3 (provider=claude experiment.attempts=0))"
    )
    assert "ANTHROPIC_API_KEY is not set" in lines[1] and lines[1].endswith(
        "(jobs 2 (provider=claude experiment.attempts=1), 3 (provider=claude experiment.attempts=0))"
    )
    assert "cannot connect" not in proc.stderr
    assert not sweep_dir.exists()  # no job started


def test_a_sweep_starts_each_distinct_tool_configuration_once_before_its_first_job(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    starts = tmp_path / "starts.log"
    counted = f"{{command: python, args: ['{COUNTED_SERVER}'], env: {{COUNTED_LOG: '{starts}'}}, scope: run}}"
    proc = run_flowllm(
        "-m",
        "progress=false",
        f"hydra.sweep.dir={sweep_dir}",
        f"+tools.servers.counted={counted}",  # in every job: it starts
        "tools.servers.tool-math.command=python,no-such-binary",  # jobs 2 and 3 name a server that cannot start
        "agent.max_turns=3,4",  # two jobs per tool configuration: each configuration is started once
        timeout=240,
    )
    assert proc.returncode == ExitCode.CONFIG, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # the server that cannot start, said once with the jobs it stops
    assert lines[0].startswith("flowllm: error: tools.servers.tool-math: did not start: ")
    assert "no-such-binary" in lines[0]
    assert lines[0].endswith(
        "(jobs 2 (tools.servers.tool-math.command=no-such-binary agent.max_turns=3), "
        "3 (tools.servers.tool-math.command=no-such-binary agent.max_turns=4))"
    )
    assert len(starts.read_text().splitlines()) == 2  # two distinct tool configurations, four jobs
    assert not sweep_dir.exists()  # no job started


def test_a_sweep_baseline_is_matched_as_the_sweep_summary_matches_it() -> None:
    """The check before the first job (a real sweep refused by it: tests/stats/test_sweep_stats.py)."""
    jobs = [["progress=false", "hydra.sweep.dir=out", f"agent.max_turns={n}"] for n in (5, 6)]
    assert baseline_problem(None, jobs) is None  # unset: the first job
    assert baseline_problem("agent.max_turns=6", jobs) is None
    assert baseline_problem("1", jobs) is None
    several = baseline_problem("progress=false", jobs)
    assert several is not None and "names 2 jobs, not one" in several
    assert baseline_problem("hydra.sweep.dir=out", jobs) is not None  # Hydra's settings are not a job's overrides
    assert baseline_problem("2", jobs) is not None


def test_sweep_code_is_the_worst_job() -> None:
    ok = {"status": "ok", "completed": 2, "failed": 0}
    some = {"status": "ok", "completed": 1, "failed": 1}
    none_ok = {"status": "ok", "completed": 0, "failed": 2}
    assert sweep_exit_code([ok, ok]) is ExitCode.OK
    assert sweep_exit_code([ok, some]) is ExitCode.SOME_FAILED
    assert sweep_exit_code([ok, none_ok]) is ExitCode.SOME_FAILED
    assert sweep_exit_code([none_ok, none_ok]) is ExitCode.ALL_FAILED
    assert sweep_exit_code([ok, {"status": "error"}]) is ExitCode.SWEEP_JOB_ERROR
    assert sweep_exit_code([{"status": "error"}, {"status": "interrupted"}]) is ExitCode.INTERRUPTED


def test_a_sweep_asks_each_distinct_provider_once_before_its_first_job(tmp_path: Path) -> None:
    ports = []
    for _ in range(2):
        with socket.socket() as sock:  # closed again at once: nothing listens there
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
    urls = [f"http://127.0.0.1:{port}/v1" for port in ports]
    sweep_dir = tmp_path / "sweep"
    proc = run_flowllm(
        "-m",
        "progress=false",
        "provider=local",
        f"hydra.sweep.dir={sweep_dir}",
        f"provider.base_url={','.join(urls)}",
        "agent.max_turns=3,4",  # two jobs per provider: each provider is said once, with both its jobs
        timeout=240,
    )
    assert proc.returncode == ExitCode.CONFIG, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    for url, line, jobs in zip(urls, lines, ("jobs 0", "jobs 2"), strict=True):
        assert f"provider 'local' at {url}: cannot connect" in line and f"({jobs} (provider.base_url={url}" in line
    assert not sweep_dir.exists()


def test_a_sweep_whose_job_folder_holds_a_task_it_leaves_out_is_refused_before_its_first_job(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    both = gaia_overrides("tools=none", f"dataset.task_ids=[{LIST_TASK},{WRONG_TASK}]")
    first = run_flowllm(*both, f"hydra.run.dir={sweep_dir / '1'}", "agent.max_turns=6", timeout=240)
    assert first.returncode == 0, first.stderr[-2000:]
    one = gaia_overrides("tools=none", f"dataset.task_ids=[{LIST_TASK}]")
    proc = run_flowllm("-m", *one, f"hydra.sweep.dir={sweep_dir}", "agent.max_turns=5,6", timeout=240)
    assert proc.returncode == ExitCode.CONFIG, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flowllm: error: ")]
    assert errors == [
        f"flowllm: error: {sweep_dir / '1'} holds results of 1 task this run does not select ({WRONG_TASK}): its "
        "summary would count fewer tasks than the folder holds; select them too, or run into a new hydra.sweep.dir "
        "(job 1 (agent.max_turns=6))"
    ]
    assert not (sweep_dir / "0").exists()  # no job started
