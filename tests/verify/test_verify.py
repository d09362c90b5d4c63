"""``flowllm verify``: a fresh run verifies; any number edited afterwards is named; runs made before the
composition fixes (kept as a fixture) are reported with the disagreement each bug left in them."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from flowllm.exit_codes import ExitCode
from flowllm.export.inspect_log import write_eval_log
from flowllm.export.source import open_source
from flowllm.inspect.cli import main as inspect_main
from flowllm.verify import totals
from flowllm.verify.cli import main as verify_main
from tests.appfork import run_app
from tests.experiment.helpers import ROOT, run_flowllm

TASK = "sample-02-word-count"


def verify(run: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = verify_main([str(run), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_sample_run_verifies(sample_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = verify(sample_run, capsys)
    assert code == ExitCode.OK, out
    assert "verified (" in out and "NOT" not in out


def test_verify_is_a_command_of_python_m_flowllm(sample_run: Path) -> None:
    done = run_app(["verify", str(sample_run), "--json"], cwd=ROOT, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["verified"] is True and body["findings"] == [] and body["compared"] > 100


def _json_edit(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _ledger_edit(path: Path) -> None:
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    assert first["type"] == "attempt"
    first["cost_usd"] = round(first["cost_usd"] * 2, 6)
    lines[0] = json.dumps(first)
    path.write_text("\n".join(lines) + "\n")


def _reply_edit(run: Path) -> None:
    """The final saved wire reply of a task now says another answer."""
    outputs = sorted((run / "tasks" / TASK).glob("turn_*/*_call_model/output.json"))
    path = outputs[-1]
    path.write_text(path.read_text().replace("\\\\boxed{7}", "\\\\boxed{9}"))


def _set(*keys: str | int, value: object) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        node = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return edit


EDITS: dict[str, tuple[Callable[[Path], None], str]] = {
    "an answer": (
        lambda run: _json_edit(run / "tasks" / TASK / "result.json", _set("answer", value="8")),
        f"tasks/{TASK}/result.json: answer: the run says '8', the evidence gives '7'",
    ),
    "a correct": (
        lambda run: _json_edit(run / "tasks" / TASK / "result.json", _set("correct", value=False)),
        f"tasks/{TASK}/result.json: correct: the run says False, the evidence gives True",
    ),
    "a ledger cost": (lambda run: _ledger_edit(run / "usage.jsonl"), "usage.jsonl: line 1: cost_usd"),
    "an interval": (
        lambda run: _json_edit(run / "summary.json", _set("stats", "accuracy", "ci95", 0, value=0.5)),
        "summary.json: stats.accuracy.ci95: the run says [0.5,",
    ),
    "the summary's accuracy": (
        lambda run: _json_edit(run / "summary.json", _set("accuracy", value=0.9)),
        "summary.json: accuracy: the run says 0.9, the evidence gives 1.0",
    ),
    "a saved reply": (
        _reply_edit,
        f"tasks/{TASK}/result.json: answer: the run says '7', the evidence gives '9'",
    ),
    "a node's output": (  # a replay trusts digests.json: an edited record must not hide behind it
        lambda run: _json_edit(
            run / "tasks" / TASK / "turn_001" / "05_parse_tool_calls" / "output.json", _set("bad_tool_calls", value=[1])
        ),
        f"tasks/{TASK}/digests.json: outputs.turn_001/05_parse_tool_calls: the run says '",
    ),
    "what acted": (  # an epochs run once counted no trimming, compaction or recalled memory in its epochs
        lambda run: _json_edit(run / "summary.json", _set("acted", "trimmed_turns", value=3)),
        "summary.json: acted.trimmed_turns: the run says 3, the evidence gives 0 (the node records)",
    ),
    "a digest naming a file outside the run": (
        lambda run: _json_edit(run / "tasks" / TASK / "digests.json", _set("outputs", "../../../x", value="00")),
        f"tasks/{TASK}/digests.json: outputs.../../../x: the run says '00', the evidence gives 'a node folder inside",
    ),
}


@pytest.mark.parametrize("what", list(EDITS))
def test_editing_any_number_is_named(
    what: str, sample_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(sample_run, run)
    edit, expected = EDITS[what]
    edit(run)
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.UNVERIFIED
    assert expected in out, out


OLD_BUGS = {
    # A fork's statistics left out the forked tasks: n=7 where the accuracy line counted 10.
    "fork": "summary.json: stats.scored: the run says 7, the evidence gives 10",
    # Tasks a budget stopped were scored wrong (0/4) though each was unfinished.
    "budget": "summary.json: scored: the run says 4, the evidence gives 0",
    # The budget was not checked between epochs: spent far past the cap plus the turns in flight.
    "epochs": "summary.json: budget.spent.cost_usd: the run says 0.062817, the evidence gives 'at most",
    # A replay showed the saved run's cost as its own.
    "replay": "summary.json: cost_usd: the run says 0.060422, the evidence gives 0.0",
    # A refused resume rewrote the saved config.
    "refused": ".hydra/config.yaml: tools.name: the run says 'none', the evidence gives 'default'",
}


def test_an_old_clean_run_verifies(old_runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = verify(old_runs / "plain", capsys)
    assert code == ExitCode.OK, out


@pytest.mark.parametrize("name", list(OLD_BUGS))
def test_old_runs_show_each_bug_as_a_disagreement(
    name: str, old_runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = verify(old_runs / name, capsys)
    assert code == ExitCode.UNVERIFIED
    assert OLD_BUGS[name] in out, out


def test_json_names_every_finding(old_runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = verify(old_runs / "fork", capsys, "--json")
    assert code == ExitCode.UNVERIFIED
    body = json.loads(out)
    assert body["verified"] is False
    scored = [f for f in body["findings"] if f["field"] == "stats.scored"]
    assert scored == [{"file": "summary.json", "field": "stats.scored", "saved": 7, "recomputed": 10, "evidence": ""}]


def test_a_sweep_folder_audits_each_job(old_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    shutil.copytree(old_runs / "plain", sweep / "0")
    shutil.copytree(old_runs / "budget", sweep / "1")
    code, out, _ = verify(sweep, capsys)
    assert code == ExitCode.UNVERIFIED
    assert f"{sweep / '0'}: verified" in out
    assert f"{sweep / '1'}: NOT verified" in out


def test_exports_are_compared_with_the_run(
    sample_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An Inspect AI log (read back by inspect_ai) and a GAIA submission agree with the run; an edited answer in
    the submission is named by its line."""
    log, submission = tmp_path / "run.eval", tmp_path / "answers.jsonl"
    for fmt, path in (("inspect", log), ("gaia-submission", submission)):
        done = run_app(
            ["export", str(sample_run), "--format", fmt, "-o", str(path)],
            module="flowllm.inspect",
            cwd=ROOT,
            env=dict(os.environ),
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    code, out, _ = verify(sample_run, capsys, "--export", str(log), "--export", str(submission))
    assert code == ExitCode.OK, out
    lines = submission.read_text().splitlines()
    edited = [json.loads(line) for line in lines]
    number = next(n for n, line in enumerate(edited, start=1) if line["task_id"] == TASK)
    edited[number - 1]["model_answer"] = "8"
    submission.write_text("\n".join(json.dumps(line) for line in edited) + "\n")
    code, out, _ = verify(sample_run, capsys, "--export", str(submission))
    assert code == ExitCode.UNVERIFIED
    assert f"answers.jsonl: line {number} ({TASK}): model_answer: the run says '8', the evidence gives '7'" in out
    # The log's usage is recounted from the ledgers: a sample whose tokens are not the ones billed is named.
    from inspect_ai.log import read_eval_log, write_eval_log

    eval_log = read_eval_log(str(log))
    sample = next(s for s in eval_log.samples or [] if s.id == TASK)
    (usage,) = sample.model_usage.values()
    usage.input_tokens += 1000
    write_eval_log(eval_log, str(log))
    code, out, _ = verify(sample_run, capsys, "--export", str(log))
    assert code == ExitCode.UNVERIFIED
    assert f"run.eval: sample {TASK}: model_usage tokens: the run says {{'input_tokens': {usage.input_tokens}" in out


def test_a_submission_of_a_run_of_part_of_the_split_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GAIA scores a file of every task of the split, so the tasks the run did not select (or its budget never
    started) get an empty answer. verify wanted no answer at all for them: every such line was a disagreement."""
    run = tmp_path / "run"
    done = run_flowllm("progress=false", f"dataset.task_ids=[{TASK}]", f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    submission = tmp_path / "answers.jsonl"
    done = run_app(
        ["export", str(run), "--format", "gaia-submission", "-o", str(submission)],
        module="flowllm.inspect",
        cwd=ROOT,
        env=dict(os.environ),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    answers = {line["task_id"]: line["model_answer"] for line in map(json.loads, submission.read_text().splitlines())}
    assert len(answers) == 10 and answers[TASK] == "7" and sorted(set(answers.values())) == ["", "7"]
    code, out, _ = verify(run, capsys, "--export", str(submission))
    assert code == ExitCode.OK, out


def test_inspect_and_the_report_say_whether_a_run_verifies(old_runs: Path) -> None:
    from flowllm.inspect.report import build_report_data

    for name, verified in (("plain", True), ("fork", False)):
        done = run_app(
            [str(old_runs / name), "--json"], module="flowllm.inspect", cwd=ROOT, env=dict(os.environ), timeout=300
        )
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)["verification"]
        assert shown["verified"] is verified
        page = build_report_data(old_runs / name)["runs"][0]["verification"]
        assert page == shown
    assert shown["text"].startswith("NO: 14 disagreement(s), the first: summary.json: stats.scored")


def test_a_forks_live_cost_is_its_own_ledgers(
    old_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fork = tmp_path / "fork"
    shutil.copytree(old_runs / "fork", fork)
    shutil.copytree(old_runs / "plain", tmp_path / "plain")  # the saved run, at the path the fork names
    _json_edit(fork / "summary.json", _set("fork", "live_cost_usd", value=0.0001))
    code, out, _ = verify(fork, capsys)
    assert code == ExitCode.UNVERIFIED
    assert "summary.json: fork.live_cost_usd: the run says 0.0001, the evidence gives 0.00445 (usage.jsonl)" in out
    assert "fork.full_rerun_cost_usd" not in out  # agrees with the saved run's ledger


def test_a_limit_verdict_is_checked_against_the_turns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    done = run_flowllm("progress=false", "agent.limits.turns=2", f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.OK, out
    limited = next(p for p in sorted(run.glob("tasks/*/result.json")) if json.loads(p.read_text())["status"] == "limit")
    _json_edit(limited, _set("turns", value=1))
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.UNVERIFIED
    name = limited.relative_to(run).as_posix()
    assert f"{name}: turns: the run says 1, the evidence gives 2 (a task ended by agent.limits.turns" in out


# Turn 1's reply is paid for (a tiny budget is then spent) and already names an answer; its tool call outlives the
# task's timeout, so the attempt fails, and the budget keeps the second attempt from starting.
TIMED_OUT_SCRIPT = r"""
default:
- text: I could not finish this task. \boxed{none}
tasks:
  sample-02-word-count:
  - text: "My guess is \\boxed{41}; let me check it with Python.\n<use_mcp_tool>\n<server_name>tool-python</server_name>
      \n<tool_name>run_python</tool_name>\n<arguments>\n{\"code\": \"import time\\ntime.sleep(600)\"}\n</arguments>
      \n</use_mcp_tool>\n"
"""


def test_a_failed_attempt_the_budget_cut_short_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    matrix = Path(__file__).resolve().parent / "data" / "matrix"
    rows = (matrix / "metadata.jsonl").read_text().splitlines()
    (data / "metadata.jsonl").write_text("".join(r + "\n" for r in rows if f'"{TASK}"' in r))
    shutil.copy(matrix / "poem.txt", data)
    script = tmp_path / "script.yaml"
    script.write_text(TIMED_OUT_SCRIPT)
    run = tmp_path / "run"
    done = run_flowllm(
        "progress=false",
        f"dataset.path={data}",
        f"provider.emulator_script={script}",
        "experiment.task_timeout_s=8",
        "experiment.attempts=2",
        "experiment.budget.cost_usd=0.0000001",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == ExitCode.BUDGET, done.stderr[-2000:]
    result = run / "tasks" / TASK / "result.json"
    saved = json.loads(result.read_text())
    assert (saved["status"], saved["answer"], saved["attempts"], saved["scored"]) == ("budget", None, 1, False)
    assert saved["error"].startswith("task timed out") and "before attempt 2" in saved["halt_detail"]
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.OK, out
    _json_edit(result, _set("answer", value="41"))  # the failed attempt's reply named it: still not its answer
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.UNVERIFIED
    assert f"tasks/{TASK}/result.json: answer: the run says '41', the evidence gives None" in out


def test_a_budget_overrun_is_bounded_by_calls_not_attempts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Past the cap, the call in flight finishes: an empty reply (billed) and its retry are one call, and the
    budget's bound counts them as one."""
    run = tmp_path / "run"
    done = run_flowllm(
        "progress=false",
        "experiment.max_concurrent=1",
        "experiment.budget.cost_usd=0.0000001",
        "+provider.emulator_faults={rules: [{fault: empty, turns: [1], attempts: [1]}]}",
        "provider.retry.base_delay_s=0.01",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == ExitCode.BUDGET, done.stderr[-2000:]
    outcomes = [json.loads(line)["outcome"] for line in (run / "usage.jsonl").read_text().splitlines()]
    assert outcomes[:3] == ["empty_reply", "ok", "ok"]  # two attempts, then the call's own line
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.OK, out


def test_a_replay_that_repeats_the_saved_experiment_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``provider=replay provider.run_dir=RUN`` with no experiment repeats the saved run's (its dataset, agent,
    epochs...). Its ``.hydra/config.yaml`` must be that config as it ran: it was the command line's default one,
    so every replay of a run of another experiment, or over epochs, failed ``flowllm verify`` (33 disagreements
    for the GAIA sample)."""
    saved, replay = tmp_path / "saved", tmp_path / "replay"
    done = run_flowllm("progress=false", "+experiment=gaia_sample", "experiment.epochs=2", f"hydra.run.dir={saved}")
    assert done.returncode == 0, done.stderr[-2000:]
    again = run_flowllm("progress=false", "provider=replay", f"provider.run_dir={saved}", f"hydra.run.dir={replay}")
    assert again.returncode == 0, again.stderr[-2000:]
    code, out, _ = verify(replay, capsys)
    assert code == ExitCode.OK, out
    recorded = (replay / ".hydra" / "config.yaml").read_text()
    assert "name: gaia_sample" in recorded and "epochs: 2" in recorded


def test_a_replay_of_a_run_its_budget_ended_says_so_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay stops where the saved run's budget stopped it, and billed nothing itself. It said "finished",
    exit 0 (every task completed), with a task unfinished, its headline without the unfinished count and the
    budget "not reached". It now ends as the saved run ended, saying why, and verify holds that verdict against the
    saved run's summary."""
    saved, replay = tmp_path / "saved", tmp_path / "replay"
    caps = (
        "progress=false",
        "+experiment=gaia_sample",
        "experiment.budget.cost_usd=0.01",
        "experiment.max_concurrent=1",
    )
    done = run_flowllm(*caps, f"hydra.run.dir={saved}")
    assert done.returncode == ExitCode.BUDGET, done.stderr[-2000:]
    again = run_flowllm("progress=false", "provider=replay", f"provider.run_dir={saved}", f"hydra.run.dir={replay}")
    assert again.returncode == ExitCode.BUDGET, again.stderr[-2000:]
    summary = json.loads((replay / "summary.json").read_text())
    assert summary["unfinished"] > 0 and summary["budget"]["ended_run"] is True
    assert summary["budget"]["reason"].startswith("the replayed run's budget ended it: the run spent")
    assert f"{summary['unfinished']} unfinished, not counted" in again.stdout
    assert "rerun into the replayed run's folder with a higher experiment.budget" in again.stdout
    code, out, _ = verify(replay, capsys)
    assert code == ExitCode.OK, out
    # The diff's replay figures count the tasks the summary counts. A task the budget stopped was in the
    # denominator beside the summary's accuracy when it had a verdict ("100.0% (7/9)"), as the reduced result of
    # a task stopped between its epochs has: one such task, as that run writes it.
    stopped = json.loads((replay / "tasks" / "gaia-sample-02" / "result.json").read_text())
    stopped |= {"status": "budget", "correct": False}
    (replay / "tasks" / "gaia-sample-03").mkdir()
    (replay / "tasks" / "gaia-sample-03" / "result.json").write_text(
        json.dumps({**stopped, "task_id": "gaia-sample-03"})
    )
    assert inspect_main(["diff", str(saved), str(replay), "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["replay"]["b"]
    assert (counts["exact_correct"], counts["exact_judged"]) == (summary["correct"], summary["scored"])
    shutil.rmtree(replay / "tasks" / "gaia-sample-03")
    _json_edit(replay / "summary.json", _set("budget", "ended_run", value=False))  # what a replay said before
    code, out, _ = verify(replay, capsys)
    assert "budget.ended_run: the run says False, the evidence gives True (the replayed run's summary)" in out, out


MATRIX = Path(__file__).resolve().parent / "data" / "matrix"  # GAIA's hidden "?", an empty and a missing answer


def test_a_replays_accuracy_is_recounted_from_the_verdicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The auditor recounts a replay's headline accuracy from the tasks' verdicts, not only with the function that
    made it: when that function counted the tasks with no ground truth (4 right of 5 stated as 50%, 4/8), the run
    and the auditor agreed. With the function made wrong that way again, the stated figure is still caught."""
    saved, replay = tmp_path / "saved", tmp_path / "replay"
    data = (f"dataset.path={MATRIX}", f"provider.emulator_script={MATRIX / 'script.yaml'}")
    done = run_flowllm("progress=false", *data, f"hydra.run.dir={saved}")
    assert done.returncode in (0, 3), done.stderr[-2000:]
    again = run_flowllm("progress=false", "provider=replay", f"provider.run_dir={saved}", f"hydra.run.dir={replay}")
    assert again.returncode in (0, 3), again.stderr[-2000:]
    code, out, _ = verify(replay, capsys)
    assert code == ExitCode.OK, out
    summary = json.loads((replay / "summary.json").read_text())
    right, judged, replayed = summary["correct"], summary["scored"], summary["replay"]["scored"]
    assert judged < replayed, "the dataset has tasks with no ground truth"

    real = totals.replay_summary

    def every_replayed_task(verdicts: list) -> dict | None:  # the old denominator
        found = real(verdicts)
        return None if found is None else {**found, "accuracy_scored": round(right / replayed, 4)}

    monkeypatch.setattr("flowllm.verify.totals.replay_summary", every_replayed_task)
    wrong = round(right / replayed, 4)
    _json_edit(replay / "summary.json", _set("replay", "accuracy_scored", value=wrong))
    _json_edit(replay / "summary.json", _set("accuracy", value=wrong))
    code, out, _ = verify(replay, capsys)
    assert code == ExitCode.UNVERIFIED
    truth = round(right / judged, 4)
    assert f"summary.json: replay.accuracy_scored: the run says {wrong}, the evidence gives {truth}" in out, out
    assert f"summary.json: accuracy: the run says {wrong}, the evidence gives {truth}" in out, out


def test_a_budget_bound_counts_each_session_as_it_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Past the cap, every task in flight finishes its turn: a session of 6 tasks at once spends up to 6 calls past
    it. A resume at 1 task at once once made verify bound the whole run by 1 call (a legitimate run refused), and
    ``experiment.workers=auto`` made it fail on ``int('auto')``. Each session's line now records its tasks at once
    and its worker processes, and the bound is the busiest session's."""
    run = tmp_path / "run"
    for at_once in (6, 1):
        done = run_flowllm(
            "progress=false",
            f"experiment.max_concurrent={at_once}",
            "experiment.budget.cost_usd=0.0000001",
            f"hydra.run.dir={run}",
        )
        assert done.returncode == ExitCode.BUDGET, done.stderr[-2000:]
    sessions = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert [s["concurrency"] for s in sessions] == [{"tasks": 6, "workers": 1}, {"tasks": 1, "workers": 1}]
    summary = json.loads((run / "summary.json").read_text())
    calls = sum(1 for line in (run / "usage.jsonl").read_text().splitlines() if '"attempt"' in line)
    assert calls > 1 and summary["budget"]["spent"]["cost_usd"] > 0  # more than one call past the cap
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.OK, out
    # A line written before sessions recorded it: read from its overrides; workers=auto is not known then.
    for session in sessions:
        del session["concurrency"]
    sessions[0]["overrides"] = ["experiment.workers=auto"]
    (run / "history.jsonl").write_text("".join(json.dumps(s) + "\n" for s in sessions))
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.OK, out
    assert "not checked: the budget's bound: how many workers experiment.workers=auto started" in out
    # Sessions of 1 task at once each, but ``flowllm ctl RUN set experiment.max_concurrent=6`` raised it while
    # the first ran: its line in the history counts.
    for session in sessions:
        session["overrides"] = ["experiment.max_concurrent=1"]
    (run / "history.jsonl").write_text("".join(json.dumps(s) + "\n" for s in sessions))
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.UNVERIFIED and "the cap plus the turns in flight" in out, out
    raised = {"control": "set", "args": ["experiment.max_concurrent=6"], "ok": True, "answer": "set"}
    (run / "history.jsonl").write_text("".join(json.dumps(s) + "\n" for s in [sessions[0], raised, sessions[1]]))
    code, out, _ = verify(run, capsys)
    assert code == ExitCode.OK, out


def test_a_judged_epoch_the_budget_stopped_verifies_unscored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A judge's verdicts are taken as recorded, but not where no verdict counts: an epoch the budget stopped
    mid-conversation says ``correct: false`` in its result.json, and verify took that as the judge's verdict, so
    the Inspect log, which rightly leaves the epoch unscored, was refused."""
    matrix = Path(__file__).resolve().parent / "data"
    run, log = tmp_path / "run", tmp_path / "run.eval"
    done = run_flowllm(
        "progress=false",
        f"dataset.path={matrix / 'matrix'}",
        "provider=offline_chat",
        f"provider.emulator_script={matrix / 'matrix' / 'script.yaml'}",
        "experiment.epochs=3",
        "experiment.budget.cost_usd=0.01",
        "dataset.scorer=judge",
        "judge.provider=offline",
        "judge.template=browsecomp",
        f"judge.emulator_script={matrix / 'matrix_judge.yaml'}",
        "experiment.shard=0/2",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == ExitCode.BUDGET, done.stderr[-2000:]
    stopped = [p for p in run.glob("tasks/*/epochs/*/result.json") if json.loads(p.read_text())["status"] == "budget"]
    assert stopped and all(json.loads(p.read_text())["correct"] is False for p in stopped)
    write_eval_log(open_source(run), log)
    code, out, _ = verify(run, capsys, "--export", str(log))
    assert code == ExitCode.OK, out
