"""``experiment.coordination=redis://...``: two shard processes that share a Redis (started here on a free loopback
port) hold one requests-per-minute limit and one budget together, each of which either alone would exceed;
measured on their ledgers (every request the emulator answered is an attempt line)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from flowllm.app import run
from flowllm.core.coordination import Coordination, RedisLimits, RedisSpend, connect
from flowllm.exit_codes import ExitCode, run_exit_code
from flowllm.export.inspect_log import write_eval_log
from flowllm.export.source import open_source
from flowllm.providers.adaptive.aimd import AdaptiveConcurrency, AdaptiveSettings
from flowllm.run import budget_report
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import LedgerLine, RunSummary
from flowllm.verify.cli import main as verify_main
from tests.experiment.helpers import run_flowllm, start_flowllm
from tests.redis_server import MISSING, free_port, redis_server

RPM = 240  # 4 a second, a burst of 4 (flowllm/providers/limiter.py): the sample's 22 calls need 4.5 s together
PER_S, BURST = RPM / 60, 4
BUDGET_USD = 0.02  # each shard's half of the sample costs about $0.03
CONCURRENT = 2
# The sample's replies call run_python and read_file only: one tool server fewer to start in each process.
UNUSED_TOOLS = ("~tools.servers.tool-math",)


@pytest.fixture(scope="module")
def runs(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Two pairs of shard processes at once, one pair per shared limit (the keys of a pair: ``?run=NAME``), and a
    fifth process given a Redis nobody listens on."""
    root = tmp_path_factory.mktemp("coordinated")
    pairs = {
        "rate": [f"provider.rate_limit.requests_per_minute={RPM}"],
        "budget": [f"experiment.budget.cost_usd={BUDGET_USD}", f"experiment.max_concurrent={CONCURRENT}"],
    }
    procs, folders = [], {}
    for name, extra in pairs.items():
        folders[name] = [root / f"{name}{i}" for i in range(2)]
        for i, folder in enumerate(folders[name]):
            url = f"experiment.coordination='{redis_url}?run={name}'"
            args = ["progress=false", f"experiment.shard={i}/2", url, *extra, *UNUSED_TOOLS, f"hydra.run.dir={folder}"]
            procs.append((start_flowllm(*args, log=root / f"{name}{i}.log"), root / f"{name}{i}.log"))
    gone = f"experiment.coordination=redis://127.0.0.1:{free_port()}/0"
    refused = start_flowllm("progress=false", gone, f"hydra.run.dir={root / 'gone'}", log=root / "gone.log")
    for proc, log in procs:
        assert proc.wait(timeout=600) in (0, 3), log.read_text()[-2000:]  # 3: the budget ended the run
    assert refused.wait(timeout=600) == 2
    folders["gone"] = [root / "gone"]
    return folders


def _attempts(folders: list[Path]) -> list[LedgerLine]:
    lines = []
    for folder in folders:
        for raw in RunLayout(folder).ledger.read_text().splitlines():
            line = LedgerLine.from_dict(json.loads(raw))
            if line.type == "attempt":
                lines.append(line)
    return lines


def test_two_processes_hold_one_requests_per_minute_limit(runs: dict[str, list[Path]]) -> None:
    lines = _attempts(runs["rate"])
    assert len(lines) == 22  # the whole sample, both halves
    starts = sorted(float(line.ts or 0.0) for line in lines)
    # Any stretch of time: at most the burst plus the rate's worth. Two requests of slack: a send time is taken
    # after admission, later by however long the loaded event loop took to get there.
    for i, first in enumerate(starts):
        for j in range(i + 1, len(starts)):
            assert j - i + 1 <= BURST + PER_S * (starts[j] - first) + 2, (i, j)
    # Each process alone at the limit would have sent its 11 calls in under 2 s: together twice the limit.
    assert starts[-1] - starts[0] >= (len(starts) - BURST - 1) / PER_S
    for folder in runs["rate"]:
        assert sum(float(line.limiter_wait_s or 0) for line in _attempts([folder])) > 0  # both were held back


def test_two_processes_hold_one_budget(runs: dict[str, list[Path]]) -> None:
    lines = _attempts(runs["budget"])
    spent = sum(float(line.cost_usd or 0.0) for line in lines)
    # Up to the turns in flight when the budget was reached: each process's running tasks finish their turn.
    in_flight = 2 * CONCURRENT * max(float(line.cost_usd or 0.0) for line in lines)
    assert BUDGET_USD <= spent <= BUDGET_USD + in_flight
    assert spent < 2 * BUDGET_USD  # what two budgets of their own would have let them spend
    summaries = [RunSummary.from_dict(json.loads(RunLayout(f).summary.read_text())) for f in runs["budget"]]
    assert sum(s.unfinished or 0 for s in summaries)  # the one budget left tasks for a rerun


def test_an_unreachable_redis_is_refused_before_the_first_task(runs: dict[str, list[Path]]) -> None:
    folder = runs["gone"][0]
    said = [line for line in (folder.parent / "gone.log").read_text().splitlines() if "error" in line]
    assert len(said) == 1 and "experiment.coordination: cannot reach Redis at redis://127.0.0.1:" in said[0]
    assert not RunLayout(folder).tasks.exists()


def test_the_adaptive_limit_is_one_for_the_processes_of_every_machine(redis_url: str) -> None:
    """``max_concurrent=auto`` with coordination: two processes (two machines) read and move one limit per
    provider and model, kept in Redis; a 429 one of them meets cuts the limit the other admits by."""
    now = [0.0]
    flights, closers = [], []
    for _ in range(2):
        limits = RedisLimits(connect(f"{redis_url}?run=adaptive", "unused"))
        adaptive = AdaptiveConcurrency(AdaptiveSettings(16, shared_value=limits.value), clock=lambda: now[0])
        flights.append(adaptive.flight("emulator", "model"))
        closers.append(limits)
    a, b = (flight.controller for flight in flights)
    start = a.limit
    assert b.limit == start
    a.overloaded(a.admit())  # a 429 on the first machine
    now[0] += 1.0  # past the second's refresh of what it read
    assert a.limit < start and b.limit == a.limit
    for limits in closers:
        asyncio.run(limits.aclose())


def test_a_shard_the_shared_budget_ended_says_so_and_a_fork_of_it_spends_its_own(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shard that starts after the others spent the shared budget starts no task. It once said "finished",
    exit 0, the budget not reached (its own folder had spent nothing); it now ends as the budget ended it (exit 3),
    and its summary records the shared spend, which verify holds against its own. A fork of a coordinated run
    inherits the saved run's settings, but not its Redis key: it once shared the saved run's spent budget and
    started nothing."""
    shared = f"experiment.coordination='{redis_url}?run=spent'"
    folders = [tmp_path / f"shard{i}" for i in range(2)]
    for i, folder in enumerate(folders):
        args = ("progress=false", f"experiment.shard={i}/2", f"experiment.budget.cost_usd={BUDGET_USD / 4}")
        done = run_flowllm(*args, shared, *UNUSED_TOOLS, f"hydra.run.dir={folder}")
        assert done.returncode == ExitCode.BUDGET, done.stderr[-2000:]
    late = RunSummary.from_dict(json.loads(RunLayout(folders[1]).summary.read_text()))
    assert late.budget is not None and late.budget.ended_run and late.status == "finished"
    assert late.budget.spent["cost_usd"] == 0 and late.budget.shared_spent is not None
    assert late.budget.shared_spent["cost_usd"] >= BUDGET_USD / 4
    assert late.budget.reason is not None and late.budget.reason.startswith("the runs sharing its budget")
    assert late.completed == 0 and late.budget.not_started == late.tasks
    log = tmp_path / "late.eval"
    write_eval_log(open_source(folders[1]), log)  # a run that started no task exports, with no sample
    assert verify_main([str(folders[1]), "--export", str(log)]) == 0, capsys.readouterr().out
    fork = tmp_path / "fork"
    done = run_flowllm(
        "progress=false",
        "provider=replay",
        f"provider.run_dir={folders[0]}",
        "provider.fork=live",
        "provider.live=offline",
        "repair=strict",
        f"hydra.run.dir={fork}",
    )
    assert done.returncode in (0, 3), done.stderr[-2000:]
    assert "coordination: null" in (fork / ".hydra" / "config.yaml").read_text()
    assert RunSummary.from_dict(json.loads(RunLayout(fork).summary.read_text())).completed > 0
    assert verify_main([str(fork)]) == 0, capsys.readouterr().out


def test_a_shard_whose_shared_spend_cannot_be_read_at_its_summary_says_what_its_run_saw(
    redis_url: str,
    tmp_path: Path,
    composed: Callable[[Sequence[str]], DictConfig],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Redis answers while the late shard runs (its budget gate sees the others' spend and starts no task), but
    not when its summary is written. The summary once fell back to the folder's own spend, $0: the budget "had
    not ended the run", exit 0, with every task unstarted. It now says what the run saw, records that the shared
    spend could not be read, and verify says it cannot check that, rather than failing or passing it."""
    shared = f"experiment.coordination='{redis_url}?run=unread'"
    caps = ("progress=false", f"experiment.budget.cost_usd={BUDGET_USD / 4}", *UNUSED_TOOLS)
    first = run_flowllm(*caps, "experiment.shard=0/2", shared, f"hydra.run.dir={tmp_path / 'shard0'}")
    assert first.returncode == ExitCode.BUDGET, first.stderr[-2000:]
    gone = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens: the summary's read is refused

    def unreachable(coordination: Coordination) -> RedisSpend:
        return RedisSpend(Coordination(gone, coordination.namespace))

    monkeypatch.setattr(budget_report, "RedisSpend", unreachable)
    late = tmp_path / "shard1"
    cfg = composed([*caps, "experiment.shard=1/2", shared])
    summary = RunSummary.coerce(run(cfg, late))
    assert summary.budget is not None and summary.budget.ended_run and summary.completed == 0
    assert summary.budget.reason is not None and summary.budget.reason.startswith("the runs sharing its budget")
    unread = summary.budget.shared_spent or {}
    assert unread["cost_usd"] is None and unread["error"].startswith("not read when the summary was written: Redis at")
    assert run_exit_code(summary) == ExitCode.BUDGET
    capsys.readouterr()
    RunLayout(late).config.parent.mkdir()
    RunLayout(late).config.write_text(OmegaConf.to_yaml(cfg))  # what Hydra writes when it runs the app
    assert verify_main([str(late)]) == 0
    assert "experiment.coordination is not known" in capsys.readouterr().out


def test_a_redis_that_goes_away_while_the_run_runs_stops_new_tasks_and_the_run_is_summarised(tmp_path: Path) -> None:
    """The Redis keeping a capped run's shared spend stops while the first task's first model call is held (1 s,
    the call of a turn that calls a tool). The run crashed with a traceback (exit 1, a flowllm bug) and no
    summary; the turn's budget check then failed the task, counted wrong. Now that task stops unfinished (a rerun
    runs it), no new task starts, one line says why, the run ends as an interrupted one (exit 130: a rerun into the
    folder resumes), and its summary is written and verifies."""
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    (tmp_path / "redis").mkdir()
    with redis_server(tmp_path / "redis") as url:
        if url is None:
            pytest.skip(MISSING)
        proc = start_flowllm(
            "progress=false",
            "+experiment=gaia_sample",
            f"experiment.coordination='{url}?run=gone-mid-run'",
            "experiment.budget.cost_usd=1",
            "experiment.max_concurrent=1",
            "+provider.emulator_faults={rules: [{fault: delay, delay_s: 1.0}]}",
            f"hydra.run.dir={run_dir}",
            log=log,
        )
        deadline = time.monotonic() + 300  # a hang guard only
        while not (run_dir / "tasks" / "gaia-sample-01" / "turn_001").is_dir():  # its first call is being held
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
    # The server is gone.
    assert proc.wait(timeout=300) == ExitCode.INTERRUPTED, log.read_text()[-3000:]
    said = log.read_text()
    assert "Traceback" not in said and "no new tasks start: the run's spend cannot be read: Redis at" in said
    summary = RunSummary.from_dict(json.loads(RunLayout(run_dir).summary.read_text()))
    assert summary.interrupted and summary.unfinished and summary.budget is not None and not summary.failed
    stopped = json.loads((run_dir / "tasks" / "gaia-sample-01" / "result.json").read_text())
    assert stopped["status"] == "budget" and stopped["halt_detail"].startswith("the run's spend cannot be read")
    assert (summary.budget.shared_spent or {})["error"].startswith("not read when the summary was written: Redis at")
    assert verify_main([str(run_dir)]) == 0
