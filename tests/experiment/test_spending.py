"""Per-task limits (agent.limits) and the run's budget (experiment.budget), measured on a real usage ledger file.

The units drive ``TaskGate`` and ``Projector`` with ledger lines written by ``UsageLedger`` (two writers on one
file stand for two worker processes) and a fake clock; the end-to-end tests run the app against the emulator.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from flowllm.core.types import Usage
from flowllm.engine.recorder import read_json
from flowllm.errors import ConfigError
from flowllm.exit_codes import ExitCode, run_exit_code
from flowllm.inspect.cli import main as inspect_main
from flowllm.providers.ledger import UsageLedger
from flowllm.spend.pricing import PriceTable
from flowllm.spend.projection import Projector
from flowllm.spend.spending import RunBudget, SpendBook, TaskGate, TaskLimits, refuse_unpriced
from tests.appfork import run_app
from tests.experiment.helpers import (
    CSV_TASK,
    GAIA,
    LIST_TASK,
    MATH_TASK,
    ROOT,
    WRONG_TASK,
    gaia_overrides,
    run_flowllm,
)

pytestmark = pytest.mark.long

MODEL = "priced-model"
PRICES = PriceTable.from_mapping({MODEL: {"input": 1.0, "output": 10.0}})  # USD per million tokens


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def bill(ledger: UsageLedger, task_id: str, input_tokens: int, output_tokens: int, *, ok: bool = True) -> None:
    ledger.write(
        {
            "type": "attempt",
            "task_id": task_id,
            "agent": "main",
            "outcome": "ok" if ok else "server",
            "usage": Usage(input_tokens=input_tokens, output_tokens=output_tokens).to_dict(),
            "cost_usd": ledger.cost(MODEL, Usage(input_tokens=input_tokens, output_tokens=output_tokens)) if ok else 0,
        }
    )


def waited(ledger: UsageLedger, task_id: str, seconds: float) -> None:
    ledger.write({"type": "call", "task_id": task_id, "outcome": "ok", "wait_s": seconds})


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "usage.jsonl"


# ----- settings -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"tokens": 0}, "agent.limits.tokens must be a whole number above 0"),
        ({"turns": -2}, "agent.limits.turns must be a whole number above 0"),
        ({"output_tokens": 10.5}, "agent.limits.output_tokens must be a whole number"),
        ({"cost_usd": float("nan")}, "agent.limits.cost_usd must be a number above 0"),
        ({"wall_s": True}, "agent.limits.wall_s must be a number above 0"),
        ({"steps": 3}, "agent.limits has no setting steps"),
        ({"score_partial": "yes"}, "agent.limits.score_partial must be true or false"),
    ],
)
def test_a_bad_limit_is_one_config_error_naming_it(given: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TaskLimits.from_config(given)


def test_a_bad_budget_is_refused() -> None:
    with pytest.raises(ConfigError, match=re.escape("experiment.budget.cost_usd must be a number above 0")):
        RunBudget.from_config({"cost_usd": -1})
    with pytest.raises(ConfigError, match=re.escape("experiment.budget has no setting dollars")):
        RunBudget.from_config({"dollars": 1})
    assert RunBudget.from_config({"tokens": 5}).tokens == 5 and not RunBudget.from_config({}).active


def test_a_cost_cap_refuses_an_unpriced_model_by_name() -> None:
    limits, budget = TaskLimits(cost_usd=1.0), RunBudget()
    refused = re.escape("agent.limits.cost_usd cannot be kept: no price for model 'mystery-1'")
    with pytest.raises(ConfigError, match=refused):
        refuse_unpriced([MODEL, "mystery-1"], PRICES, limits, budget)
    refuse_unpriced(["mystery-1"], PRICES, TaskLimits(tokens=10), RunBudget(tokens=10))  # no cost cap: fine
    refuse_unpriced([MODEL], PRICES, limits, RunBudget(cost_usd=1.0))


# ----- the gate -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("limits", "named"),
    [
        (TaskLimits(tokens=1500), "tokens"),
        (TaskLimits(output_tokens=150), "output_tokens"),
        (TaskLimits(cost_usd=0.003), "cost_usd"),  # 1000 x $1/M + 100 x $10/M = $0.002 per call
    ],
)
def test_the_gate_halts_a_task_on_its_own_spend_since_the_attempt_began(
    ledger_path: Path, limits: TaskLimits, named: str
) -> None:
    with UsageLedger(ledger_path, prices=PRICES) as ledger:
        bill(ledger, "t", 50_000, 5_000)  # an earlier attempt (or session) of the task: not this attempt's
        bill(ledger, "other", 50_000, 5_000)  # another task's spend
        gate = TaskGate("t", SpendBook(ledger_path), limits, RunBudget())
        bill(ledger, "t", 1000, 100)
        bill(ledger, "t", 9_999, 9_999, ok=False)  # a failed attempt bills nothing
        assert gate.after_turn("main", 1) is None
        bill(ledger, "t", 1000, 100)
        halt = gate.after_turn("main", 2)
    assert halt is not None and halt.status == "limit" and halt.limit == named
    assert f"agent.limits.{named}" in halt.detail


def test_turns_count_the_main_agent_and_time_is_wall_minus_waiting(ledger_path: Path) -> None:
    clock = Clock()
    with UsageLedger(ledger_path, prices=PRICES) as ledger:
        book = SpendBook(ledger_path)
        turns = TaskGate("t", book, TaskLimits(turns=3), RunBudget(), clock=clock)
        assert turns.after_turn("researcher", 5) is None, "a sub-agent's turns are its own"
        assert turns.after_turn("main", 2) is None
        halt = turns.after_turn("main", 3)
        assert halt is not None and halt.limit == "turns"

        working = TaskGate("w", book, TaskLimits(working_s=10.0, wall_s=30.0), RunBudget(), clock=clock)
        clock.now += 12.0
        waited(ledger, "w", 4.0)  # 4 s behind a rate limit or a back-off: not working time
        assert working.after_turn("main", 1) is None  # worked 8 s
        clock.now += 3.0
        halt = working.after_turn("main", 2)  # worked 11 s of 15 s
        assert halt is not None and halt.limit == "working_s" and "11.0s" in halt.detail
        clock.now += 20.0
        waited(ledger, "w", 100.0)  # more waiting than wall time (concurrent calls): working time stays >= 0
        halt = working.after_turn("main", 3)
        assert halt is not None and halt.limit == "wall_s"


def test_the_budget_counts_every_writer_of_the_run_ledger(ledger_path: Path) -> None:
    budget = RunBudget(tokens=3000)
    with UsageLedger(ledger_path, prices=PRICES) as mine, UsageLedger(ledger_path, prices=PRICES) as other_worker:
        gate = TaskGate("a", SpendBook(ledger_path), TaskLimits(), budget)
        bill(mine, "a", 1000, 0)
        assert gate.after_turn("main", 1) is None
        bill(other_worker, "b", 2000, 0)  # another worker's task
        halt = gate.after_turn("main", 2)
    assert halt is not None and halt.status == "budget" and halt.limit is None
    assert "3,000 tokens of its 3,000" in halt.detail


# ----- projection -------------------------------------------------------------------------------------------------
def test_projection_scales_this_sessions_rate_and_warns_once(
    ledger_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    with UsageLedger(ledger_path, prices=PRICES) as ledger:
        bill(ledger, "old", 1000, 0)  # an earlier session: $0.001
        projector = Projector(SpendBook(ledger_path), RunBudget(cost_usd=0.01), clock=clock)
        projector.start(todo=4)
        assert projector.projection() is None, "nothing is projected before a task ends"
        bill(ledger, "a", 1000, 100)  # $0.002
        clock.now += 30.0
        with caplog.at_level(logging.WARNING):
            projector.task_ended()
            projection = projector.projection()
            assert projection is not None
            assert projection.cost_usd == pytest.approx(0.001 + 4 * 0.002)  # within $0.01: no warning
            assert projection.tokens == 1000 + 4 * 1100 and projection.seconds == pytest.approx(120.0)
            assert projection.text() == "proj $0.0090 5,400 tok 2m00s"
            assert not caplog.records
            bill(ledger, "b", 2000, 200)  # $0.004: the rate rises
            projector.task_ended()
            bill(ledger, "c", 2000, 200)
            projector.task_ended()
        warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "above experiment.budget.cost_usd=$0.01" in warnings[0]


# ----- exit codes -------------------------------------------------------------------------------------------------
def test_exit_codes_of_limited_and_budget_stopped_runs() -> None:
    assert run_exit_code({"completed": 0, "limited": 2, "failed": 0}) is ExitCode.OK
    assert run_exit_code({"completed": 0, "limited": 1, "failed": 1}) is ExitCode.SOME_FAILED
    assert run_exit_code({"completed": 1, "failed": 0, "budget": {"ended_run": True}}) == 3


# ----- end to end ---------------------------------------------------------------------------------------------------
GUESSING_SCRIPT = f"""
default:
  - text: "\\\\boxed{{none}}"
tasks:
  {CSV_TASK}:
    - text: |
        My first guess is \\boxed{{3}}; let me check.
        <use_mcp_tool>
        <server_name>tool-python</server_name>
        <tool_name>run_python</tool_name>
        <arguments>{{"code": "print(3)"}}</arguments>
        </use_mcp_tool>
    - text: "\\\\boxed{{3}}"
  {MATH_TASK}:
    - text: |
        <use_mcp_tool>
        <server_name>tool-python</server_name>
        <tool_name>run_python</tool_name>
        <arguments>{{"code": "print(150.0)"}}</arguments>
        </use_mcp_tool>
    - text: "\\\\boxed{{150}}"
"""


def _ids(*ids: str) -> str:
    return f"dataset.task_ids=[{','.join(ids)}]"


def test_a_turn_limit_ends_tasks_with_the_limit_named_and_scores_the_answer_given(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(GUESSING_SCRIPT)
    run_dir = tmp_path / "run"
    proc = run_flowllm(
        *gaia_overrides(
            f"hydra.run.dir={run_dir}",
            f"provider.emulator_script={script}",
            _ids(CSV_TASK, MATH_TASK, LIST_TASK),
            "agent.limits.turns=1",
        )
    )
    assert proc.returncode == ExitCode.OK, proc.stderr[-2000:]
    guessed = read_json(run_dir / "tasks" / CSV_TASK / "result.json")
    assert (guessed["status"], guessed["limit"], guessed["answer"], guessed["correct"]) == ("limit", "turns", "3", True)
    assert guessed["turns"] == 1 and "agent.limits.turns" in guessed["halt_detail"]
    silent = read_json(run_dir / "tasks" / MATH_TASK / "result.json")
    assert (silent["status"], silent["answer"], silent["correct"]) == ("limit", None, False), "no answer given"
    summary = read_json(run_dir / "summary.json")
    assert summary["limited"] == 2 and summary["limits"] == {"turns": 2} and summary["completed"] == 1
    assert summary["correct"] == 1 and summary["unfinished"] == 0  # the guess; the third task answers "none"
    assert "ended by a limit" in proc.stdout and "limit (turns)" in proc.stdout

    shown = run_flowllm_inspect(run_dir)
    assert "limit (turns)" in shown

    # A rerun keeps the limited tasks (a limit is a setting like any other): nothing runs again.
    again = run_flowllm(
        *gaia_overrides(
            f"hydra.run.dir={run_dir}",
            f"provider.emulator_script={script}",
            _ids(CSV_TASK, MATH_TASK, LIST_TASK),
            "agent.limits.turns=1",
        )
    )
    assert again.returncode == ExitCode.OK
    assert read_json(run_dir / "summary.json")["resumed"] == 3


def test_score_partial_false_leaves_a_limited_answer_unscored(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(GUESSING_SCRIPT)
    run_dir = tmp_path / "run"
    proc = run_flowllm(
        *gaia_overrides(
            f"hydra.run.dir={run_dir}",
            f"provider.emulator_script={script}",
            _ids(CSV_TASK),
            "agent.limits.output_tokens=1",
            "agent.limits.score_partial=false",
        )
    )
    assert proc.returncode == ExitCode.OK, proc.stderr[-2000:]
    result = read_json(run_dir / "tasks" / CSV_TASK / "result.json")
    assert (result["status"], result["limit"], result["answer"]) == ("limit", "output_tokens", "3")
    assert result["correct"] is False and result["scored"] is False


def run_flowllm_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_app(list(args), module=module, cwd=ROOT, env=dict(os.environ), timeout=300)


def run_flowllm_inspect(run_dir: Path) -> str:
    done = run_flowllm_module("flowllm.inspect", str(run_dir))
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


def test_a_budget_stops_the_run_exits_3_and_a_higher_budget_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ids = _ids(CSV_TASK, MATH_TASK, LIST_TASK, WRONG_TASK)
    # One task at a time: the first (two calls, ~$0.0085) spends the $0.008 budget, so nothing else starts.
    capped = ("experiment.max_concurrent=1", f"hydra.run.dir={run_dir}", ids)
    proc = run_flowllm(*gaia_overrides(*capped, "experiment.budget.cost_usd=0.008"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    summary = read_json(run_dir / "summary.json")
    budget = summary["budget"]
    assert budget["ended_run"] is True and "experiment.budget.cost_usd" in budget["reason"]
    assert budget["spent"]["cost_usd"] >= 0.008
    assert summary["status"] == "finished" and summary["interrupted"] is False
    assert summary["finished"] + summary["unfinished"] == 4 and summary["unfinished"] >= 3
    stopped = budget["stopped_tasks"]
    assert budget["not_started"] + len(stopped) == summary["unfinished"]
    for task_id, used in stopped.items():
        assert read_json(run_dir / "tasks" / task_id / "result.json")["status"] == "budget"
        assert used["tokens"] > 0 and used["cost_usd"] > 0
    assert "the budget ended the run" in proc.stdout

    resumed = run_flowllm(*gaia_overrides(*capped, "experiment.budget.cost_usd=1"))
    assert resumed.returncode == ExitCode.OK, resumed.stderr[-2000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["unfinished"] == 0 and summary["completed"] == 4 and summary["budget"]["ended_run"] is False
    assert summary["resumed"] >= 1
    assert summary["budget"]["spent"]["cost_usd"] > budget["spent"]["cost_usd"], "the ledger spans both sessions"


def test_tasks_the_budget_stopped_count_in_neither_scored_nor_unscored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    proc = run_flowllm(
        "progress=false", "experiment.budget.cost_usd=0.0001", "experiment.max_concurrent=4", f"hydra.run.dir={run_dir}"
    )
    assert proc.returncode == ExitCode.BUDGET, proc.stderr[-2000:]
    summary = read_json(run_dir / "summary.json")
    stopped = summary["budget"]["stopped_tasks"]
    assert stopped and summary["completed"] == 0 and summary["unfinished"] == summary["tasks"]
    for task_id in stopped:
        assert read_json(run_dir / "tasks" / task_id / "result.json")["scored"] is False
    assert (summary["scored"], summary["unscored"], summary["accuracy"]) == (0, 0, None)
    assert summary["by_level"] == {}
    stats = summary["stats"]
    assert (stats["scored"], stats["unscored"], stats["accuracy"]["n"], stats["accuracy"]["ci95"]) == (0, 0, 0, None)
    assert stats["by_level"] == {}
    flat = " ".join(proc.stdout.replace("│", " ").split())
    assert "accuracy not known (0 scored)" in flat and "accuracy 0.0%" not in flat and "n=4" not in flat
    # The task table says so too: each stopped task's row is unfinished, not wrong ("no").
    rows = [line for line in proc.stdout.splitlines() if any(f"│ {task_id} " in line for task_id in stopped)]
    assert len(rows) == len(stopped) and all(re.search(r"│\s*unfinished\s*│", r) for r in rows), rows
    # `inspect tasks --status unfinished` lists them (there is no status "budget" to ask for).
    assert inspect_main([str(run_dir), "tasks", "--status", "unfinished", "--json"]) == 0
    assert sorted(row["task_id"] for row in json.loads(capsys.readouterr().out)) == sorted(stopped)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.limits.tokens=0", "agent.limits.tokens must be a whole number above 0"),
        ("+agent.limits.steps=3", "steps"),
        ("experiment.budget.tokens=-5", "experiment.budget.tokens must be a whole number above 0"),
    ],
)
def test_bad_caps_exit_2_with_one_line(tmp_path: Path, override: str, message: str) -> None:
    proc = run_flowllm(*gaia_overrides(f"hydra.run.dir={tmp_path / 'run'}", "tools=none", override))
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("flowllm: error:")]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "run" / "tasks").exists()


def test_a_cost_budget_with_an_unpriced_model_is_refused_naming_it(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("models:\n  some-other-model: {input: 1, output: 1}\n")
    proc = run_flowllm(
        *gaia_overrides(
            f"hydra.run.dir={tmp_path / 'run'}",
            "tools=none",
            f"experiment.pricing={prices}",
            "experiment.budget.cost_usd=5",
        )
    )
    assert proc.returncode == ExitCode.CONFIG
    assert "no price for model 'flowllm-emulator'" in proc.stderr and "experiment.budget.cost_usd" in proc.stderr
    assert GAIA.is_dir()


def test_the_budget_counts_every_worker_process(tmp_path: Path) -> None:
    """Two worker processes append to one ledger: each stops on the run's total, not on its own spend."""
    run_dir = tmp_path / "run"
    ids = _ids(CSV_TASK, MATH_TASK, LIST_TASK, WRONG_TASK)
    capped = (f"hydra.run.dir={run_dir}", ids, "tools=none", "experiment.workers=2", "experiment.max_concurrent=2")
    proc = run_flowllm(*gaia_overrides(*capped, "experiment.budget.cost_usd=0.002"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["budget"]["ended_run"] is True and summary["interrupted"] is False
    assert summary["unfinished"] >= 2, "neither worker went on once the run's ledger reached the budget"
    assert "the budget ended the run" in proc.stdout
    resumed = run_flowllm(*gaia_overrides(*capped, "experiment.budget.cost_usd=1"))
    assert resumed.returncode == ExitCode.OK, resumed.stderr[-2000:]
    assert read_json(run_dir / "summary.json")["unfinished"] == 0


def _ledger_epochs(run_dir: Path) -> list[int | None]:
    return [a.get("epoch") for a in UsageLedger.read(run_dir / "usage.jsonl").attempts()]


def test_a_spent_budget_starts_no_further_epoch_and_a_rerun_runs_the_missing_ones(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    capped = (f"hydra.run.dir={run_dir}", _ids(LIST_TASK, WRONG_TASK), "tools=none", "experiment.epochs=3")
    # Each task's epoch 1 is one call; the two calls in flight pass the $0.0001 budget, so no epoch 2 starts.
    proc = run_flowllm(*gaia_overrides(*capped, "experiment.budget.cost_usd=0.0001"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert _ledger_epochs(run_dir) == [1, 1]
    for task_id in (LIST_TASK, WRONG_TASK):
        result = read_json(run_dir / "tasks" / task_id / "result.json")
        assert result["status"] == "budget" and "epoch 2" in result["halt_detail"], result
    summary = read_json(run_dir / "summary.json")
    assert summary["unfinished"] == 2 and summary["budget"]["ended_run"] is True

    resumed = run_flowllm(*gaia_overrides(*capped, "experiment.budget.cost_usd=1"))
    assert resumed.returncode == ExitCode.OK, resumed.stderr[-2000:]
    assert sorted(map(int, _ledger_epochs(run_dir))) == [1, 1, 2, 2, 3, 3], "epoch 1 kept, epochs 2 and 3 run"
    listed = read_json(run_dir / "tasks" / LIST_TASK / "result.json")
    assert (listed["status"], listed["score"], len(listed["epoch_log"])) == ("completed", 1.0, 3)


def test_after_a_budget_stop_and_resume_the_headline_cost_is_the_ledgers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    capped = (f"hydra.run.dir={run_dir}", _ids(CSV_TASK))
    # The budget ends the task after its first turn (a tool call); the rerun resumes it from that saved turn.
    stopped = run_flowllm(*gaia_overrides(*capped, "experiment.budget.cost_usd=0.001"))
    assert stopped.returncode == 3, stopped.stderr[-2000:]
    assert read_json(run_dir / "tasks" / CSV_TASK / "result.json")["status"] == "budget"
    resumed = run_flowllm(*gaia_overrides(*capped, "experiment.budget.cost_usd=1"))
    assert resumed.returncode == ExitCode.OK, resumed.stderr[-2000:]
    summary = read_json(run_dir / "summary.json")
    calls = UsageLedger.read(run_dir / "usage.jsonl").attempts()
    billed = sum(a["cost_usd"] for a in calls)
    assert len(calls) == 2, "the stopped turn, then the rerun's second (the first is resumed, not paid again)"
    assert summary["cost_usd"] == pytest.approx(billed, abs=1e-6) == summary["budget"]["spent"]["cost_usd"]
    assert f"${billed:.4f} billed in this run folder (agent ${billed:.4f}" in resumed.stdout


def test_the_judge_counts_in_the_budget_and_in_every_total(tmp_path: Path) -> None:
    from flowllm.inspect.usage import sum_usage

    run_dir = tmp_path / "run"
    capped = ("+experiment=hle_sample", "experiment.max_concurrent=1", f"hydra.run.dir={run_dir}")
    # One task's answer and its judging pass the $0.0025 budget with the judge's calls, never with the agent's.
    proc = run_flowllm(*capped, "experiment.budget.cost_usd=0.0025")
    assert proc.returncode == 3, proc.stderr[-2000:]
    summary = read_json(run_dir / "summary.json")
    agent, judge = (
        sum(a["cost_usd"] for a in UsageLedger.read(run_dir / name).attempts())
        for name in ("usage.jsonl", "judge_usage.jsonl")
    )
    assert agent < 0.0025 and judge > 0 and summary["budget"]["ended_run"] is True
    cost = summary["cost"]
    assert (cost["agent_usd"], cost["judge_usd"]) == (pytest.approx(agent), pytest.approx(judge))
    assert summary["cost_usd"] == pytest.approx(agent + judge) == summary["budget"]["spent"]["cost_usd"]
    split = f"(agent ${agent:.4f}, judge ${judge:.4f}"
    assert f"${agent + judge:.4f} billed in this run folder {split}" in proc.stdout
    assert f"${agent + judge:.4f} {split})" in run_flowllm_inspect(run_dir)
    report = tmp_path / "report.html"
    made = run_flowllm_module("flowllm.inspect", "report", str(run_dir), "-o", str(report))
    assert made.returncode == 0, made.stderr
    spend = (
        f'"cost_usd":{round(agent + judge, 6)},"agent_cost_usd":{round(agent, 6)},"judge_cost_usd":{round(judge, 6)}'
    )
    assert spend in report.read_text(), "the HTML report's cost card counts the judge"
    progress = [line for line in proc.stderr.splitlines() if line.startswith("flowllm: progress:")]
    assert progress and f"cost ${agent + judge:.4f}," in progress[-1], progress
    by_agent = sum_usage([run_dir], by=["agent"])
    assert by_agent.total.cost_usd == pytest.approx(agent + judge)
    assert by_agent.buckets[("judge",)].cost_usd == pytest.approx(judge)
