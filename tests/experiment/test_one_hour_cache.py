"""A run whose cache breakpoints carry Anthropic's one-hour TTL (``provider.cache.ttl=1h``) is billed as Anthropic
bills it: a one-hour cache write at 2x the base input price, a read at 0.1x (docs.claude.com, prompt caching,
"Pricing"). The emulator reports the writes by TTL (usage.cache_creation), the ledger prices them, ``inspect usage
--cache`` counts them, and the run, whose saved replies now carry the one-hour count, still replays exactly."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from flowllm.exit_codes import ExitCode
from flowllm.inspect.cli import main as inspect_main
from flowllm.providers.ledger import UsageLedger
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import LedgerLine, RunSummary
from flowllm.spend.pricing import PriceTable
from flowllm.verify.cli import main as verify_main
from tests.experiment.helpers import ROOT, run_flowllm

HOUR = ("provider.cache.ttl=1h", "dataset.limit=2", "progress=false")
EMULATOR_PRICE = PriceTable.load(ROOT / "flowllm" / "conf" / "pricing.yaml").prices["flowllm-emulator"]


@pytest.fixture(scope="module")
def hour_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("hour") / "run"
    proc = run_flowllm(*HOUR, f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run


def ok_calls(run: Path) -> list[LedgerLine]:
    return [line for line in UsageLedger.read(RunLayout(run).ledger).attempt_lines() if line.outcome == "ok"]


def hand_cost(usage: dict[str, int], *, output: bool = True) -> float:
    """USD per Anthropic's rules: every write here is a one-hour write (2x input), a read 0.1x input."""
    price = EMULATOR_PRICE
    uncached = usage["input_tokens"] - usage["cache_read_tokens"] - usage["cache_write_tokens"]
    usd = uncached * price.input + usage["cache_read_tokens"] * 0.1 * price.input
    usd += usage["cache_write_tokens"] * 2 * price.input + output * usage["output_tokens"] * price.output
    return usd / 1e6


def test_one_hour_writes_cost_twice_the_input_price_and_reads_a_tenth(hour_run: Path) -> None:
    assert EMULATOR_PRICE.cache_read == pytest.approx(0.1 * EMULATOR_PRICE.input)
    calls = ok_calls(hour_run)
    assert any(line.usage["cache_read_tokens"] for line in calls)  # later turns read what turn 1 wrote
    for line in calls:
        usage = line.usage
        assert usage["cache_write_tokens"] > 0 and usage.get("cache_write_1h_tokens") == usage["cache_write_tokens"]
        # The ledger rounds each kind's cost to a millionth of a dollar; 1.25x instead of 2x would be off by 1e-4.
        assert line.cost_usd == pytest.approx(hand_cost(usage), abs=2e-6)
    summary = RunSummary.from_dict(orjson.loads(RunLayout(hour_run).summary.read_bytes()))
    assert summary.cost is not None
    assert summary.cost.total_usd == pytest.approx(sum(hand_cost(line.usage) for line in calls), abs=1e-5)


def test_inspect_usage_cache_counts_the_one_hour_writes_at_their_price(
    hour_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert inspect_main(["usage", str(hour_run), "--cache", "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)["cache"][0]
    by_task: dict[str, list[dict[str, int]]] = {}
    for line in ok_calls(hour_run):
        by_task.setdefault(str(line.task_id), []).append(line.usage)
    assert {row["task_id"] for row in report["tasks"]} == set(by_task)
    for row in report["tasks"]:
        usages = by_task[row["task_id"]]
        assert row["cache_write_1h_tokens"] == row["cache_write_tokens"] == sum(u["cache_write_tokens"] for u in usages)
        assert row["billed_input_usd"] == pytest.approx(sum(hand_cost(u, output=False) for u in usages), abs=1e-6)
        # The bound bills writes at the five-minute price where that TTL serves (these turns are seconds apart).
        assert row["bound_input_usd"] < row["billed_input_usd"]
    assert inspect_main(["usage", str(hour_run), "--cache"]) == 0
    assert "(1h " in capsys.readouterr().out


def test_the_one_hour_run_replays_exactly_and_verifies(
    hour_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    again = tmp_path / "again"
    proc = run_flowllm(*HOUR, "provider=replay", f"provider.run_dir={hour_run}", f"hydra.run.dir={again}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = RunSummary.from_dict(orjson.loads(RunLayout(again).summary.read_bytes()))
    assert summary.replay is not None and (summary.replay.exact, summary.replay.diverged) == (2, 0)
    assert verify_main([str(hour_run)]) == ExitCode.OK, capsys.readouterr().out
    assert verify_main([str(again)]) == ExitCode.OK, capsys.readouterr().out
