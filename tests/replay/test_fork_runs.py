"""Fork at divergence, end to end with ``python -m flowllm`` on the bundled sample against the emulator.

A saved run under ``repair=full`` forked with ``repair=strict`` must give, task by task, the correctness of a
fresh live ``repair=strict`` run, with fewer model calls, exact tasks costing nothing, and the saving stated.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from flowllm.engine.recorder import read_json
from flowllm.providers.ledger import UsageLedger
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import LedgerLine
from flowllm.spend.task_usage import read_bills
from tests.replay.runs import TASK_OVERRIDE, Finished, run_all, run_flowllm

pytestmark = pytest.mark.long

FORK = ("provider.fork=live", "provider.live=offline")


@dataclass(frozen=True)
class ForkRuns:
    saved: Finished  # the whole sample, live, repair=full
    live_strict: Finished  # the whole sample, live, repair=strict
    fork_strict: Finished  # the saved run forked with repair=strict


@pytest.fixture(scope="module")
def fork_runs(tmp_path_factory: pytest.TempPathFactory) -> ForkRuns:
    base = tmp_path_factory.mktemp("fork")
    saved = run_flowllm(base / "saved", "repair=full").check()
    jobs = {
        "live": (base / "live-strict", ("repair=strict",)),
        "fork": (
            base / "fork-strict",
            ("provider=replay", f"provider.run_dir={saved.run_dir}", *FORK, "repair=strict"),
        ),
    }
    done = run_all(jobs)
    return ForkRuns(saved, done["live"].check(), done["fork"].check())


def _results(run_dir: Path) -> dict[str, dict]:
    return {p.parent.name: read_json(p) for p in sorted((run_dir / "tasks").glob("*/result.json"))}


def test_a_fork_scores_each_task_as_a_fresh_live_run_does_for_less(fork_runs: ForkRuns) -> None:
    live, fork = _results(fork_runs.live_strict.run_dir), _results(fork_runs.fork_strict.run_dir)
    assert len(live) == len(fork) == 10
    # Task by task, the same correctness as a fresh live run under the new settings.
    assert {t: r["correct"] for t, r in fork.items()} == {t: r["correct"] for t, r in live.items()}
    assert {t: r["answer"] for t, r in fork.items()} == {t: r["answer"] for t, r in live.items()}
    assert sum(r["correct"] for r in live.values()) == 7  # strict repair fails three calls of the sample
    verdicts = {t: r["replay"] for t, r in fork.items()}
    forked = {t for t, v in verdicts.items() if v["status"] == "forked"}
    exact = {t for t, v in verdicts.items() if v["status"] == "exact"}
    assert len(forked) == 3 and len(exact) == 7
    for task in forked:
        # The stricter repair failed the turn-1 call, so the turn-2 request (with the error) went live.
        verdict = verdicts[task]
        assert verdict["turn"] == 2 and verdict["reason"].startswith("the request differs")
        assert (verdict["divergence"]["turn"], verdict["divergence"]["node"]) == (1, "repair_arguments")
        assert verdict["live_calls"] == 1
    # Exact tasks cost nothing: the ledger bills only the forked tasks' live calls.
    bills = read_bills(fork_runs.fork_strict.run_dir)
    assert set(bills) == forked
    assert all(bills[t].calls == 1 and (bills[t].cost_usd or 0) > 0 for t in forked)
    live_bills = read_bills(fork_runs.live_strict.run_dir)
    fork_calls = sum(b.calls for b in bills.values())
    assert fork_calls < sum(b.calls for b in live_bills.values())
    # The saving is stated: live spent, what a full live re-run cost (the saved run's ledger), the difference.
    summary = read_json(fork_runs.fork_strict.run_dir / "summary.json")
    assert summary["replay"]["exact"] == 7 and summary["replay"]["forked"] == 3
    assert (summary["replay"]["scored"], summary["replay"]["unscored"]) == (10, 0)
    assert summary["accuracy"] == read_json(fork_runs.live_strict.run_dir / "summary.json")["accuracy"] == 0.7
    saved_bills = read_bills(fork_runs.saved.run_dir)
    spent = round(sum(b.cost_usd or 0.0 for b in bills.values()), 6)
    full = round(sum(b.cost_usd or 0.0 for b in saved_bills.values()), 6)
    assert summary["fork"]["live_calls"] == fork_calls == 3
    assert summary["fork"]["live_cost_usd"] == pytest.approx(spent)
    assert summary["fork"]["full_rerun_calls"] == sum(b.calls for b in saved_bills.values())
    assert summary["fork"]["full_rerun_cost_usd"] == pytest.approx(full)
    assert summary["fork"]["saved_usd"] == pytest.approx(full - spent)
    assert summary["cost_usd"] == pytest.approx(spent)
    out = fork_runs.fork_strict.stdout
    assert "7 exact, 3 forked, 0 diverged" in out
    assert "70.0% (7/10 scored: exact + forked)" in out
    assert "fork: saved" in out


def test_a_fork_scores_its_forked_tasks_in_the_stats_and_the_paired_comparison(
    fork_runs: ForkRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    """One rule for which tasks are scored: the stats and ``inspect diff`` count the forked tasks as the tally
    does, and the fork's comparison with the saved run is the fresh live run's."""
    from flowllm.inspect.cli import main

    summary = read_json(fork_runs.fork_strict.run_dir / "summary.json")
    stats = summary["stats"]
    assert (stats["scored"], stats["unscored"]) == (summary["scored"], summary["unscored"]) == (10, 0)
    assert stats["accuracy"]["n"] == 10 and stats["accuracy"]["mean"] == pytest.approx(0.7)
    assert "70.0% ± 15.3" in fork_runs.fork_strict.stdout
    saved = fork_runs.saved.run_dir
    paired = {}
    for name, run in (("fork", fork_runs.fork_strict), ("live", fork_runs.live_strict)):
        assert main(["diff", str(saved), str(run.run_dir), "--json"]) == 0
        paired[name] = orjson.loads(capsys.readouterr().out)["paired"]
    fork, live = paired["fork"], paired["live"]
    assert (fork["n"], fork["fixed"], fork["broken"], fork["unchanged"]) == (10, 0, 3, 7)
    assert fork["diff"] == live["diff"] == pytest.approx(-0.3)
    assert fork == live


def test_a_live_reply_records_who_answered_and_the_history_the_prefix_built(fork_runs: ForkRuns) -> None:
    fork = fork_runs.fork_strict.run_dir
    task = next(t for t, r in _results(fork).items() if r["replay"]["status"] == "forked")
    call = read_json(fork / "tasks" / task / "turn_002" / "03_call_model" / "output.json")
    assert call["raw_response"]["flowllm_fork"]["provider"] == "offline"
    # The live request carries the replayed turn 1 as this run built it: the strict repair's error result.
    sent = orjson.dumps(call["raw_request"]).decode()
    assert "Could not parse your arguments" in sent
    live_call = read_json(fork_runs.live_strict.run_dir / "tasks" / task / "turn_002" / "03_call_model" / "output.json")
    assert call["raw_request"] == live_call["raw_request"]


def _calls(run_dir: Path) -> list[LedgerLine]:
    return [line for line in UsageLedger.read(RunLayout(run_dir).ledger).attempt_lines() if line.outcome == "ok"]


def test_a_forks_first_live_turn_is_billed_a_cache_write_not_a_read(fork_runs: ForkRuns) -> None:
    """The fork's emulator never saw the replayed turns (prompt caching as documented, emulator/prompt_cache.py):
    a forked task's first live call reads nothing and writes its prompt, where the saved run's same call read
    what its turn 1 had written."""
    fork = _calls(fork_runs.fork_strict.run_dir)
    saved = {(line.task_id, line.turn): line for line in _calls(fork_runs.saved.run_dir)}
    assert len(fork) == 3
    for line in fork:
        usage, before = line.usage or {}, saved[(line.task_id, line.turn)].usage or {}
        assert line.turn == 2 and usage["cache_read_tokens"] == 0 and usage["cache_write_tokens"] > 0
        assert before["cache_read_tokens"] > 0


def test_fork_at_turn_forks_every_task_there(tmp_path: Path, fork_runs: ForkRuns) -> None:
    saved = fork_runs.saved.run_dir
    finished = run_flowllm(
        tmp_path / "at2",
        "provider=replay",
        f"provider.run_dir={saved}",
        *FORK,
        "provider.fork_at_turn=2",
        TASK_OVERRIDE,
    ).check()
    results = _results(finished.run_dir)
    for task, result in results.items():
        verdict = result["replay"]
        assert (verdict["status"], verdict["turn"], verdict["reason"]) == ("forked", 2, "provider.fork_at_turn=2")
        assert result["correct"] is True  # nothing changed but who answered turn 2: the emulator again
        assert verdict["live_calls"] == read_bills(finished.run_dir)[task].calls == 1
    stats = read_json(finished.run_dir / "summary.json")["stats"]
    assert (stats["scored"], stats["unscored"], stats["accuracy"]["mean"]) == (len(results), 0, 1.0)
    assert "no scored task" not in finished.stdout


def test_a_fork_resumes_a_task_that_did_not_finish(tmp_path: Path, fork_runs: ForkRuns) -> None:
    """A rerun keeps the finished tasks (and their live cost); an unfinished one replays its prefix for free and
    goes live again from its fork."""
    copy = tmp_path / "resumed"
    shutil.copytree(fork_runs.fork_strict.run_dir, copy, ignore=shutil.ignore_patterns("workspace"))
    results = _results(copy)
    task = next(t for t, r in results.items() if r["replay"]["status"] == "forked")
    (copy / "tasks" / task / "result.json").unlink()  # as if interrupted before it finished
    saved = fork_runs.saved.run_dir
    finished = run_flowllm(copy, "provider=replay", f"provider.run_dir={saved}", *FORK, "repair=strict").check()
    summary = read_json(finished.run_dir / "summary.json")
    assert summary["resumed"] == 9
    again = _results(copy)[task]
    assert again["replay"]["status"] == "forked" and again["replay"]["turn"] == 2
    assert again["correct"] == results[task]["correct"]
    assert (summary["replay"]["exact"], summary["replay"]["forked"]) == (7, 3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("provider.fork=live",), "provider.fork=live needs provider.live=<a provider choice"),
        (("provider.fork=live", "provider.live=replay"), "provider.live=replay is itself a replay"),
        (("provider.fork=live", "provider.live=nosuch"), "provider.live=nosuch"),
        (("provider.fork=live", "provider.live=offline", "provider.fork_at_turn=0"), "provider.fork_at_turn must be"),
        (("provider.live=offline",), "provider.live and provider.fork_at_turn need provider.fork=live"),
        (
            (
                "provider.fork=live",
                "provider.live=offline",
                "~pipeline.nodes.trim_history",
                "+pipeline.nodes.mark_cache.inputs={request_messages:messages}",
            ),
            "the saved run's pipeline had node(s) trim_history that this pipeline lacks",
        ),
    ],
)
def test_bad_fork_settings_are_one_line_and_exit_2(
    tmp_path: Path, fork_runs: ForkRuns, overrides: tuple[str, ...], message: str
) -> None:
    finished = run_flowllm(
        tmp_path / "bad", "provider=replay", f"provider.run_dir={fork_runs.saved.run_dir}", *overrides, TASK_OVERRIDE
    )
    assert finished.returncode == 2, finished.stderr[-2000:]
    assert message in finished.stderr
    assert "Traceback" not in finished.stderr
    assert not (tmp_path / "bad" / "tasks").exists() or not any((tmp_path / "bad" / "tasks").iterdir())


def test_inspect_and_diff_show_the_fork_and_what_it_saved(
    fork_runs: ForkRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    from flowllm.inspect.cli import main

    saved, fork = fork_runs.saved.run_dir, fork_runs.fork_strict.run_dir
    assert main([str(fork)]) == 0
    flat = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "70.0% (7/10 scored: exact + forked)" in flat
    assert "fork: live spent" in flat and "fork: full live re-run" in flat and "fork: saved" in flat
    assert main(["diff", str(saved), str(fork), "--json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    forked = {t["task_id"]: t["replay"]["b"] for t in data["tasks"] if (t.get("replay") or {}).get("b")}
    assert len(forked) == 3 and all(v["status"] == "forked" and v["turn"] == 2 for v in forked.values())
    side = data["replay"]["b"]
    assert (side["exact"], side["forked"], side["scored"], side["unscored"]) == (7, 3, 10, 0)
    summary = read_json(fork / "summary.json")
    assert side["fork"] == summary["fork"] and side["fork"]["saved_usd"] > 0
    assert main(["diff", str(saved), str(fork)]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "B forked at turn 2 (turn 1 / repair_arguments)" in text
    assert "accuracy (scored: exact + forked) - 70.0% (7/10)" in text
    assert "fork: saved" in text


def test_a_fork_may_continue_with_another_wire_protocol(tmp_path: Path, fork_runs: ForkRuns) -> None:
    """The saved run spoke Anthropic's protocol; the live part speaks OpenAI's chat completions, its request
    rebuilt from the conversation the replayed prefix built."""
    finished = run_flowllm(
        tmp_path / "chat",
        "provider=replay",
        f"provider.run_dir={fork_runs.saved.run_dir}",
        "provider.fork=live",
        "provider.live=offline_chat",
        "repair=strict",
        TASK_OVERRIDE,
    ).check()
    live = _results(fork_runs.live_strict.run_dir)
    for task, result in _results(finished.run_dir).items():
        assert result["correct"] == live[task]["correct"]
    forked = [t for t, r in _results(finished.run_dir).items() if r["replay"]["status"] == "forked"]
    assert forked == ["sample-01-csv-revenue"]
    call = read_json(finished.run_dir / "tasks" / forked[0] / "turn_002" / "03_call_model" / "output.json")
    record = call["raw_response"]["flowllm_fork"]
    assert record["provider"] == "offline_chat"
    sent = record["request"]
    assert sent["messages"][0]["role"] == "system"  # chat completions: the system prompt is a message
    assert "Could not parse your arguments" in orjson.dumps(sent).decode()
    assert "choices" in call["raw_response"]  # an OpenAI reply, normalized by the live provider


def test_a_live_provider_that_fails_fails_the_forked_task_as_any_live_failure(
    tmp_path: Path, fork_runs: ForkRuns
) -> None:
    """The live part of a fork goes through the resilience layer: retried, then a stated task failure; the
    tasks that replayed exactly are untouched."""
    from omegaconf import OmegaConf

    from tests.replay.runs import PROJECT_ROOT

    providers = tmp_path / "providers"
    providers.mkdir()
    failing = OmegaConf.load(PROJECT_ROOT / "flowllm" / "conf" / "provider" / "offline.yaml")
    failing.pop("defaults", None)
    failing.name = "failing"
    failing.emulator_script = str(PROJECT_ROOT / "flowllm" / "data" / "sample" / "script.yaml")
    failing.emulator_faults = {"rules": [{"fault": "status", "status": 529}]}
    failing.retry = {"max_attempts": 2, "base_delay_s": 0.01}
    OmegaConf.save(failing, providers / "failing.yaml")
    finished = run_flowllm(
        tmp_path / "failing-run",
        "provider=replay",
        f"provider.run_dir={fork_runs.saved.run_dir}",
        "provider.fork=live",
        "provider.live=failing",
        f"provider.config_dir={providers}",
        "repair=strict",
        TASK_OVERRIDE,
    ).check(3)  # some tasks failed, the others completed
    results = _results(finished.run_dir)
    failed = results["sample-01-csv-revenue"]
    assert failed["status"] == "failed" and failed["correct"] is False
    assert "529" in (failed["error"] or "")
    assert (failed["replay"]["status"], failed["replay"]["turn"]) == ("forked", 2)
    clean = results["sample-07-department"]
    assert clean["replay"]["status"] == "exact" and clean["correct"] is True
    bill = read_bills(finished.run_dir)["sample-01-csv-revenue"]
    assert (bill.calls, bill.attempts, bill.failed_attempts) == (1, 2, 2)  # retried once, then given up


def test_inspect_usage_and_the_report_show_the_cache_hit_rate_and_the_bound(
    fork_runs: ForkRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per task and run: the share of input read from the cache (the ledger's counts) and the input billed
    against the cache-optimal bound of the prompts the run sent (flowllm/spend/cache_bound.py)."""
    from flowllm.inspect.cli import main
    from flowllm.inspect.report import build_report_data

    saved = fork_runs.saved.run_dir
    assert main(["usage", str(saved), "--cache", "--json"]) == 0
    cache = orjson.loads(capsys.readouterr().out)["cache"][0]
    calls = _calls(saved)
    for row in cache["tasks"]:
        usage = [line.usage or {} for line in calls if line.task_id == row["task_id"]]
        read, total = sum(u["cache_read_tokens"] for u in usage), sum(u["input_tokens"] for u in usage)
        assert row["hit_rate"] == pytest.approx(read / total)
    run = cache["total"]
    assert 0 < run["bound_input_usd"] <= run["billed_input_usd"]  # a bound: nothing bills below it
    assert run["over_bound"] == pytest.approx(run["billed_input_usd"] / run["bound_input_usd"])
    assert main(["usage", str(saved), "--cache"]) == 0
    assert "billed / bound" in capsys.readouterr().out
    report = build_report_data(saved)["runs"][0]
    assert report["cache"] == run
    assert {t["task_id"]: t["cache_hit_rate"] for t in report["tasks"]} == {
        row["task_id"]: row["hit_rate"] for row in cache["tasks"]
    }


def test_a_change_that_reaches_no_request_forks_without_a_live_call(tmp_path: Path) -> None:
    """A setting that shows in a node's output but changes no request (compaction's threshold, below which no
    history grows here): the task diverged, yet every request after it was the saved run's, so the saved replies
    answered them and it is scored as the new pipeline's without a live call. Its verdict once said "no model call
    followed the divergence", though every turn after it made one."""
    compacting = ("+experiment=gaia_sample", "agent.compaction.enabled=true")
    saved = run_flowllm(tmp_path / "saved", *compacting, "agent.compaction.threshold_tokens=300").check()
    forked = run_flowllm(
        tmp_path / "fork",
        "provider=replay",
        f"provider.run_dir={saved.run_dir}",
        *FORK,
        "agent.compaction.threshold_tokens=200",
    ).check()
    verdict = forked.result("gaia-sample-01")["replay"]
    assert (verdict["status"], verdict["turn"], verdict["live_calls"]) == ("forked", None, 0)
    assert verdict["divergence"] == {"turn": 1, "node": "compact_history", "what": "compaction.threshold: 300 vs 200"}
    assert (
        verdict["reason"]
        == "no request after the divergence differed from the saved run's: saved replies answered them"
    )
    assert saved.result("gaia-sample-01")["turns"] > 1  # model calls did follow the divergence
