"""Judged benchmarks end to end, as a user runs them: ``python -m flowllm +experiment=<name>_sample`` in its own
process, the agent and the judge each through the real Anthropic SDK against their own loopback emulator.

One original BrowseComp run feeds the rest: a resume that must not judge again, a re-judge of the saved run
by another judge (whose reply for one task has no verdict) without calling the agent's model, and a resume of
that re-judge that asks the judge again for that task only. Two multiruns run the other samples: a sweep
across three benchmarks that gives one table, and the remaining judged samples."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from flowllm.engine.recorder import read_json
from flowllm.run.report import headline_accuracy
from flowllm.verify.cli import main as verify_main
from tests.appfork import run_app

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 900  # a hang guard only: the machine running the suite may be loaded


def flowllm(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "200"}
    return run_app([*args, "progress=false"], cwd=ROOT, timeout=TIMEOUT_S, env=env)


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"flowllm failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def ledger(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def attempts(path: Path) -> list[dict[str, Any]]:
    return [line for line in ledger(path) if line.get("type") == "attempt"]


# The other judge: overloaded on its first call for task 1 (retried like any call), no verdict for task 2.
JUDGE_SCRIPT = """\
faults:
  rules:
    - {fault: status, status: 529, tasks: [browsecomp-0001], agents: [judge], attempts: [1]}
default:
  - text: "extracted_final_answer: whatever\\ncorrect: yes\\nconfidence: 100"
tasks:
  browsecomp-0002/judge:
    - text: "I would rather not say."
"""
FIXED_JUDGE_SCRIPT = """\
default:
  - text: "correct: yes"
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("judged")
    original = base / "original"
    sweep = base / "sweep"
    others = base / "others"
    jobs = [
        ("+experiment=browsecomp_sample", f"hydra.run.dir={original}"),
        ("-m", "+experiment=gaia_sample,frames_sample,simpleqa_sample", f"hydra.sweep.dir={sweep}"),
        ("-m", "+experiment=hle_sample,xbench_deepsearch_sample,webwalkerqa_sample", f"hydra.sweep.dir={others}"),
    ]
    with ThreadPoolExecutor(len(jobs)) as pool:
        for proc in pool.map(lambda args: flowllm(*args), jobs):
            ok(proc)
    # A resume of a copy that lost one task's result.json (killed after judging, before the result was
    # written): the agent reruns that task, the judge is not asked again.
    resumed = base / "resumed"
    shutil.copytree(original, resumed)
    (resumed / "tasks" / "browsecomp-0003" / "result.json").unlink()
    # Re-judge the saved run by another judge; the replay provider serves the agent's replies.
    script = base / "judge_alt.yaml"
    script.write_text(JUDGE_SCRIPT)
    rejudged = base / "rejudged"
    rejudge = (
        "provider=replay",
        f"provider.run_dir={original}",
        "judge.provider=offline",
        f"judge.emulator_script={script}",
        f"hydra.run.dir={rejudged}",
    )
    with ThreadPoolExecutor(2) as pool:
        for proc in pool.map(
            lambda args: flowllm(*args), [("+experiment=browsecomp_sample", f"hydra.run.dir={resumed}"), rejudge]
        ):
            ok(proc)
    # Resume the re-judge with a judge that now answers: only the unscored task is judged again. Another judge is
    # another setting, so the resume must be forced (its fingerprint keeps both).
    rescored = base / "rescored"
    shutil.copytree(rejudged, rescored)
    fixed = base / "judge_fixed.yaml"
    fixed.write_text(FIXED_JUDGE_SCRIPT)
    ok(
        flowllm(
            "provider=replay",
            f"provider.run_dir={original}",
            "judge.provider=offline",
            f"judge.emulator_script={fixed}",
            f"hydra.run.dir={rescored}",
            "experiment.resume=force",
        )
    )
    return {
        "original": original,
        "sweep": sweep,
        "others": others,
        "resumed": resumed,
        "rejudged": rejudged,
        "rescored": rescored,
    }


def test_a_judged_run_scores_through_the_judge_and_counts_it_apart(runs: dict[str, Path]) -> None:
    run = runs["original"]
    summary = read_json(run / "summary.json")
    assert (summary["correct"], summary["tasks"], summary["scoring_errors"]) == (2, 3, 0)
    assert summary["scorer"] == "judge"
    judge = summary["judge"]
    assert judge["model"] == "flowllm-emulator" and judge["template"] == "browsecomp"
    assert judge["verdicts"] == {"correct": 2, "incorrect": 1}
    assert judge["parse_failures"] == 0 and judge["calls"] == 3
    assert judge["usage"]["input_tokens"] > 0
    games = {"tasks": 1, "scored": 1, "unscored": 0, "correct": 0, "accuracy": 0.0}
    assert summary["breakdown"]["topic"]["Games"] == games
    # The agent's ledger holds the agent's calls only; the judge's are in its own.
    assert {line["agent"] for line in attempts(run / "usage.jsonl")} == {"main"}
    assert {line["agent"] for line in attempts(run / "judge_usage.jsonl")} == {"judge"}
    assert summary["providers"]["calls"] == 3
    # Recorded under the task, in the layout inspect and replay read.
    call = run / "tasks" / "browsecomp-0003" / "judge" / "turn_001"
    saved = read_json(call / "01_call_model" / "output.json")
    assert "correct: no" in str(saved["raw_response"])
    assert "f2" in str(saved["raw_request"])  # the correct answer went into the grader prompt
    result = read_json(run / "tasks" / "browsecomp-0003" / "result.json")
    assert (result["correct"], result["verdict"], result["score_error"]) == (False, "incorrect", None)


def test_the_inspect_log_bills_the_judges_calls_with_the_agents(runs: dict[str, Path]) -> None:
    """Inspect's model usage is every model call of the run, the grader's included (as Inspect's own logs hold
    it): the two ledgers' billed tokens beside the summary's cost, which counts the judge too."""
    pytest.importorskip("inspect_ai", reason='inspect_ai is not installed (pip install "flowllm[inspect]")')
    from flowllm.export.inspect_log import build_eval_log
    from flowllm.export.source import open_source

    run = runs["original"]
    log = build_eval_log(open_source(run))
    billed = attempts(run / "usage.jsonl") + attempts(run / "judge_usage.jsonl")
    (usage,) = log.stats.model_usage.values()  # the agent and the judge are the same emulated model here
    assert usage.input_tokens == sum(line["usage"]["input_tokens"] for line in billed)
    assert usage.output_tokens == sum(line["usage"]["output_tokens"] for line in billed)
    assert usage.total_cost == pytest.approx(read_json(run / "summary.json")["cost_usd"])
    judged = [line for line in billed if line["task_id"] == "browsecomp-0003"]
    (sample,) = [s for s in log.samples or [] if s.id == "browsecomp-0003"]
    (task_usage,) = sample.model_usage.values()
    assert task_usage.input_tokens == sum(line["usage"]["input_tokens"] for line in judged)
    assert {line["agent"] for line in judged} == {"main", "judge"}


def test_inspect_usage_counts_a_judged_run_once_with_both_ledgers(runs: dict[str, Path]) -> None:
    from io import StringIO

    from rich.console import Console

    from flowllm.inspect.usage import main as usage_main

    run = runs["original"]
    out = StringIO()
    assert usage_main([str(run)], console=Console(file=out, width=200)) == 0
    assert "usage of 1 run(s)" in out.getvalue()  # two ledgers, one run
    billed = attempts(run / "usage.jsonl") + attempts(run / "judge_usage.jsonl")
    assert f"{sum(line['usage']['input_tokens'] for line in billed):,}" in out.getvalue()


def test_a_resume_does_not_judge_twice(runs: dict[str, Path]) -> None:
    before = attempts(runs["original"] / "judge_usage.jsonl")
    after = attempts(runs["resumed"] / "judge_usage.jsonl")
    assert len(after) == len(before) == 3  # the copied ledger, and not one judge call more
    agent_calls = attempts(runs["resumed"] / "usage.jsonl")
    # The original run's 3 and not one more: the task that lost its result resumes inside itself, its one saved
    # turn replayed from the saved reply (docs/guides/resume.md), so its model call is not paid twice.
    assert len(agent_calls) == 3
    result = read_json(runs["resumed"] / "tasks" / "browsecomp-0003" / "result.json")
    assert result["resumed_turns"] == 1
    assert result["judge"]["cached"] is True and result["verdict"] == "incorrect"
    summary = read_json(runs["resumed"] / "summary.json")
    assert summary["judge"]["cached"] == 1 and summary["correct"] == 2


def test_a_saved_run_is_rejudged_by_another_judge_without_the_agents_model(runs: dict[str, Path]) -> None:
    run = runs["rejudged"]
    summary = read_json(run / "summary.json")
    assert summary["experiment"] == "browsecomp_sample"  # the saved run's experiment, not the default one
    assert attempts(run / "usage.jsonl") == []  # the agent's model was never called
    assert summary["providers"]["calls"] == 0
    judge_attempts = attempts(run / "judge_usage.jsonl")
    assert [line["outcome"] for line in judge_attempts].count("overloaded") == 1
    assert len(judge_attempts) == 4  # three calls, one of them retried once
    assert (summary["judge"]["calls"], summary["judge"]["retries"], summary["judge"]["calls_failed"]) == (3, 1, 0)
    # The new judge says yes to the wrong answer of task 3, and no verdict for task 2.
    assert read_json(run / "tasks" / "browsecomp-0003" / "result.json")["correct"] is True
    assert (summary["correct"], summary["scoring_errors"], summary["judge"]["parse_failures"]) == (2, 1, 1)


def test_a_judge_reply_without_a_verdict_is_a_recorded_scoring_error(runs: dict[str, Path]) -> None:
    result = read_json(runs["rejudged"] / "tasks" / "browsecomp-0002" / "result.json")
    # Not known, not wrong: the task is unscored, as the statistics and the exports already counted it.
    assert result["status"] == "completed" and result["correct"] is None and result["verdict"] is None
    assert result["score_error"] == "the judge's reply gives no verdict: I would rather not say."
    assert result["judge"]["error_kind"] == "no_verdict"
    summary = read_json(runs["rejudged"] / "summary.json")
    assert summary["accuracy_scored"] == 1.0  # 2 of the 2 tasks that could be scored
    # The headline counts it as every other figure does: 2 of 2 scored, 1 unscored (it once said 2 of 3).
    assert (summary["correct"], summary["scored"], summary["unscored"], summary["accuracy"]) == (2, 2, 1, 1.0)
    assert summary["stats"]["accuracy"]["n"] == 2 and summary["stats"]["accuracy"]["mean"] == 1.0
    assert headline_accuracy(summary) == (
        "100.0% (2/2 scored); 1 unscored: the answer could not be scored (a rerun into this folder scores it again)"
    )


def test_a_resume_judges_again_only_the_task_that_had_no_verdict(runs: dict[str, Path]) -> None:
    run = runs["rescored"]
    assert len(attempts(run / "judge_usage.jsonl")) == 5  # 4 copied, 1 new
    assert attempts(run / "usage.jsonl") == []
    result = read_json(run / "tasks" / "browsecomp-0002" / "result.json")
    assert (result["correct"], result["score_error"]) == (True, None)
    summary = read_json(run / "summary.json")
    assert (summary["correct"], summary["scoring_errors"]) == (3, 0)


def test_a_sweep_across_three_benchmarks_gives_one_table(runs: dict[str, Path]) -> None:
    sweep = read_json(runs["sweep"] / "sweep_summary.json")
    jobs = sweep["jobs"]
    assert [j["benchmark"] for j in jobs] == ["gaia_sample", "frames_sample", "simpleqa_sample"]
    assert all(j["status"] == "ok" for j in jobs)
    assert [(j["correct"], j["tasks"]) for j in jobs] == [(2, 3), (2, 3), (2, 3)]
    assert [j["judge_model"] for j in jobs] == [None, "flowllm-emulator", "flowllm-emulator"]
    table = (runs["sweep"] / "sweep_summary.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "benchmark" not in line]
    assert len(rows) == 3
    assert "| gaia_sample |" in rows[0] and "| gaia |" in rows[0]
    assert "| simpleqa_sample |" in rows[2] and "| judge flowllm-emulator |" in rows[2]
    simpleqa = read_json(runs["sweep"] / "2" / "summary.json")
    assert simpleqa["judge"]["verdicts"] == {"correct": 2, "not_attempted": 1}
    assert simpleqa["breakdown"]["topic"]["Geography"]["tasks"] == 2
    gaia = read_json(runs["sweep"] / "0" / "summary.json")
    assert gaia["scorer"] == "gaia" and "judge" not in gaia and gaia["by_level"]["1"]["correct"] == 1


def test_the_other_judged_samples_run_end_to_end(runs: dict[str, Path]) -> None:
    jobs = read_json(runs["others"] / "sweep_summary.json")["jobs"]
    assert [j["benchmark"] for j in jobs] == ["hle_sample", "xbench_deepsearch_sample", "webwalkerqa_sample"]
    assert [(j["status"], j["correct"], j["tasks"], j["scoring_errors"]) for j in jobs] == [("ok", 2, 3, 0)] * 3
    hle = read_json(runs["others"] / "0" / "summary.json")
    math = {"tasks": 2, "scored": 2, "unscored": 0, "correct": 1, "accuracy": 0.5}
    assert hle["breakdown"]["category"]["Math"] == math
    assert hle["judge"]["template"] == "hle"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (("+experiment=browsecomp_sample", "dataset.canary=nope"), "row 1: cannot decrypt question (problem)"),
        (
            ("+experiment=frames_sample", "dataset.path=data/simpleqa_sample/simple_qa_test_set.csv"),
            "no column 'Prompt' for question",
        ),
        (("+experiment=browsecomp_sample", "judge.provider=null"), "dataset.scorer=judge needs a judge"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(overrides: tuple[str, ...], expected: str, tmp_path: Path) -> None:
    proc = flowllm(*overrides, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("flowllm: error: ") and expected in lines[0], proc.stderr


def test_workers_judge_their_tasks_and_a_resume_judges_again_only_the_unscored(tmp_path: Path) -> None:
    """``experiment.workers=2`` with a judge (once refused): each worker judges its own tasks into the run's one
    judge ledger, and an answer the judge gave no verdict for is unscored. A resume deals it to a worker again,
    which judges it again without calling the agent's model (the parent once counted it as finished: never
    judged again). Under pass@3 the answer without a verdict is not run again: that paid the agent twice more
    and dropped an answer that may be right."""
    script = tmp_path / "judge_alt.yaml"
    script.write_text(JUDGE_SCRIPT)
    run = tmp_path / "run"
    args = ("+experiment=browsecomp_sample", "experiment.workers=2", "experiment.attempts=3", f"hydra.run.dir={run}")
    ok(flowllm(*args, f"judge.emulator_script={script}"))
    summary = read_json(run / "summary.json")
    assert (summary["correct"], summary["scored"], summary["unscored"], summary["scoring_errors"]) == (2, 2, 1, 1)
    unscored = read_json(run / "tasks" / "browsecomp-0002" / "result.json")
    assert (unscored["correct"], unscored["attempts"], summary["attempts_used"]) == (None, 1, 3)
    assert summary["judge"]["calls"] == 3 and len(attempts(run / "judge_usage.jsonl")) == 4  # a 529, retried
    agent_calls = attempts(run / "usage.jsonl")
    ok(flowllm(*args, "experiment.resume=force"))  # the sample's own judge, which answers
    summary = read_json(run / "summary.json")
    assert (summary["correct"], summary["scored"], summary["unscored"], summary["scoring_errors"]) == (3, 3, 0, 0)
    assert attempts(run / "usage.jsonl") == agent_calls  # the agent's model was not called again
    assert len(attempts(run / "judge_usage.jsonl")) == 5  # one more judgement: task 2's
    assert verify_main([str(run)]) == 0


def test_the_judge_replies_are_not_counted_as_the_agent_calls_a_resume_paid_for(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """verify checks that every saved reply of a resumed task was paid in ``usage.jsonl``; the judge's reply,
    saved under the task's ``judge/``, is paid in ``judge_usage.jsonl`` (counted as the agent's, a resumed
    judged task was refused)."""
    run = tmp_path / "run"
    shutil.copytree(runs["original"], run)
    path = run / "tasks" / "browsecomp-0001" / "result.json"
    result = read_json(path)
    assert result["turns"] == 1 and list((path.parent / "judge").rglob("output.json"))
    path.write_text(orjson.dumps({**result, "resumed_turns": 1}).decode())
    summary = read_json(run / "summary.json")
    (run / "summary.json").write_text(orjson.dumps({**summary, "resumed_turns": 1, "resumed_tasks": 1}).decode())
    assert verify_main([str(run)]) == 0
