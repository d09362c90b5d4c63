"""Tokens and cost in ``inspect RUN``, ``inspect RUN tasks`` and ``inspect diff A B``, checked against the run's
own records: ``usage.jsonl`` (every attempt, read here line by line) and ``summary.json`` → ``cost``."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from flowllm.inspect.cli import main
from tests.inspect.minirun import write_run, write_task
from tests.replay.runs import CLEAN_TASK, LENIENT_TASK, FixtureRuns


def usd(value: float) -> str:
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def ledger(run: Path) -> dict[str, dict[str, float]]:
    """Per task: the tokens (in + out) and cost of every attempt that was answered, from usage.jsonl."""
    bills: dict[str, dict[str, float]] = defaultdict(lambda: {"tokens": 0, "cost": 0.0})
    for line in (run / "usage.jsonl").read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if entry.get("type") != "attempt" or entry.get("outcome") != "ok" or entry.get("task_id") is None:
            continue
        bills[entry["task_id"]]["tokens"] += entry["usage"]["input_tokens"] + entry["usage"]["output_tokens"]
        bills[entry["task_id"]]["cost"] += entry["cost_usd"]
    return dict(bills)


def cells(out: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first`` (columns are two or more spaces apart)."""
    rows = (re.split(r"\s{2,}", line.strip()) for line in out.splitlines())
    return next(row for row in rows if row[0] == first)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> str:
    assert main([str(a) for a in args]) == 0
    return capsys.readouterr().out


def test_summary_shows_the_summary_cost_and_the_ledger_total(
    runs: FixtureRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs.original.run_dir
    summary = json.loads((run / "summary.json").read_text())
    bills = ledger(run)
    assert set(bills) == {LENIENT_TASK, CLEAN_TASK} and summary["cost"]["total_usd"] > 0
    out = run_cli(capsys, run)
    usage = summary["usage"]
    assert cells(out, "tokens in / out")[1] == f"{usage['input_tokens']:,} / {usage['output_tokens']:,}"
    total, model = usd(summary["cost"]["total_usd"]), summary["cost"]["model"]
    assert cells(out, "cost")[1] == f"{total} billed in this run folder (agent {total}; {model})"
    tokens = sum(int(b["tokens"]) for b in bills.values())
    cost = sum(b["cost"] for b in bills.values())
    assert cells(out, "billed (every call)")[1] == f"{tokens:,} tokens, {usd(cost)} (agent {usd(cost)})"
    # Every call of this run was a task's answer: the ledger and the results count the same tokens.
    assert tokens == usage["input_tokens"] + usage["output_tokens"]


def test_tasks_shows_each_task_s_billed_tokens_and_cost(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    run = runs.original.run_dir
    out = run_cli(capsys, run, "tasks")
    header = cells(out, "task")
    tokens_at, cost_at = header.index("tokens"), header.index("cost")
    for task, bill in ledger(run).items():
        row = cells(out, task)
        assert row[tokens_at] == f"{int(bill['tokens']):,}" and row[cost_at] == usd(bill["cost"])
    rows = {r["task_id"]: r for r in json.loads(run_cli(capsys, run, "tasks", "--json"))}
    for task, bill in ledger(run).items():
        assert rows[task]["billed_tokens"] == bill["tokens"]
        assert rows[task]["cost_usd"] == pytest.approx(bill["cost"], abs=1e-9)


def test_diff_shows_both_sides_spend_and_the_change(runs: FixtureRuns, capsys: pytest.CaptureFixture[str]) -> None:
    live, replay = runs.original.run_dir, runs.strict.run_dir
    bills = ledger(live)
    tokens = sum(int(b["tokens"]) for b in bills.values())
    cost = sum(b["cost"] for b in bills.values())
    # A replay calls no model: its ledger is empty, whatever its summary says the replayed run cost.
    assert ledger(replay) == {}
    assert json.loads((replay / "summary.json").read_text())["cost"]["replayed"] is True
    out = run_cli(capsys, "diff", live, replay)
    assert cells(out, "tokens (billed)")[1:] == [f"{tokens:,}", "0", f"-{tokens:,} (-100.0%)"]
    assert cells(out, "cost")[1:] == [usd(cost), usd(0.0), f"-{usd(cost)} (-100.0%)"]
    data = json.loads(run_cli(capsys, "diff", live, replay, "--json"))
    assert data["spend"]["a"]["tokens"] == tokens and data["spend"]["a"]["cost_usd"] == pytest.approx(cost, abs=1e-6)
    assert (data["spend"]["b"]["tokens"], data["spend"]["b"]["cost_usd"]) == (0, 0.0)
    # A run against itself: no change, shown as none (not as a rounding error's "+$0.0000").
    out = run_cli(capsys, "diff", live, live)
    assert cells(out, "tokens (billed)")[1:] == [f"{tokens:,}", f"{tokens:,}", "±0 (+0.0%)"]
    assert cells(out, "cost")[1:] == [usd(cost), usd(cost), "±$0.0000 (+0.0%)"]


def test_runs_without_a_ledger_say_where_their_figures_come_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    older = write_run(tmp_path / "older", {"cost": {"total_usd": 0.0012, "model": "m"}})  # usage: 10 in, 2 out
    replayed = write_run(
        tmp_path / "replayed", {"cost": {"total_usd": 0.0012, "model": "m", "replayed": True, "note": "spent nothing"}}
    )
    for run in (older, replayed):
        write_task(run, "t1", [[("call_model", {"messages": []}, {"response": {"text": "42"}})]])
    out = run_cli(capsys, "diff", older, replayed)
    assert cells(out, "tokens (billed)")[1:] == ["12", "0", "-12 (-100.0%)"]
    assert cells(out, "cost")[1:] == ["$0.0012", "$0.0000", "-$0.0012 (-100.0%)"]
    assert cells(out, "counted from")[1:] == [
        "the tasks' results (no usage.jsonl)",
        "nothing billed (a replay without usage.jsonl)",
    ]
    out = run_cli(capsys, replayed)
    assert cells(out, "cost")[1] == "$0.0012 (m): spent nothing" and "billed (every call)" not in out
