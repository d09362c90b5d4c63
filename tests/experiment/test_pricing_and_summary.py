"""Cost from the price table, the run summary (accuracy by level, tool calls, tokens, cost) and its table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rich.console import Console

from flowllm.core.types import Usage
from flowllm.run.outcome import COMPLETED, FAILED, TaskOutcome
from flowllm.run.report import print_summary
from flowllm.run.summary import summarize
from flowllm.spend.pricing import Price, PriceTable, PricingError, cost_breakdown
from tests.experiment.helpers import ROOT

SONNET = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)


def test_cost_counts_cached_tokens_once() -> None:
    # 10k prompt tokens of which 6k read from the cache and 1k written to it: 3k are plain input.
    usage = Usage(input_tokens=10_000, output_tokens=2_000, cache_read_tokens=6_000, cache_write_tokens=1_000)
    parts = cost_breakdown(usage, SONNET)
    assert parts == {
        "input": pytest.approx(0.009),
        "cache_read": pytest.approx(0.0018),
        "cache_write": pytest.approx(0.00375),
        "output": pytest.approx(0.03),
        "total": pytest.approx(0.04455),
    }
    assert SONNET.cost(usage) == pytest.approx(0.04455)
    # Billing the cached tokens as input too would have cost 0.03 more: the double count to avoid.
    assert SONNET.cost(usage) < (10_000 * 3.0 + 2_000 * 15.0) / 1e6


def test_price_lookup() -> None:
    table = PriceTable.from_mapping(
        {
            "models": {
                "claude-sonnet-4-5": {"input": 3, "output": 15},
                "claude-sonnet-4": {"input": 1, "output": 2},
                "gpt-5": {"input": 1.25, "output": 10, "cache_read": 0.125},
            }
        }
    )
    assert table.lookup("claude-sonnet-4-5") is table.prices["claude-sonnet-4-5"]
    # A dated snapshot takes the longest entry it starts with, not the shorter family name.
    assert table.lookup("claude-sonnet-4-5-20250929") is table.prices["claude-sonnet-4-5"]
    assert table.lookup("anthropic/Claude-Sonnet-4-5") is table.prices["claude-sonnet-4-5"]
    assert table.lookup("gpt-5").cache_write == 1.25  # missing cache prices default to the input price
    assert table.lookup("mistral-large") is None
    assert table.lookup(None) is None


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ({"m": {"input": 1}}, "models.m needs 'output'"),
        ({"m": {"input": "cheap", "output": 1}}, "models.m.input must be a number"),
        ({"m": {"input": -1, "output": 1}}, "models.m.input cannot be negative"),
        ({"m": {"input": 1, "output": 1, "per_request": 2}}, "unknown field"),
        ({"m": 3}, "models.m must be a mapping"),
    ],
)
def test_bad_price_entries_are_named(models: dict, message: str) -> None:
    with pytest.raises(PricingError, match=message):
        PriceTable.from_mapping({"models": models}, "prices.yaml")


def test_price_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PricingError, match="does not exist"):
        PriceTable.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(PricingError, match="not valid YAML"):
        PriceTable.load(bad)


def test_shipped_price_table_prices_every_shipped_provider() -> None:
    table = PriceTable.load(ROOT / "flowllm" / "conf" / "pricing.yaml")
    for path in sorted((ROOT / "flowllm" / "conf" / "provider").glob("*.yaml")):
        model = (yaml.safe_load(path.read_text()) or {}).get("model")
        if model and model != "replay":  # replay's requests carry the replayed run's model
            assert table.lookup(model) is not None, f"{path.name}: no price for {model}"
    assert table.lookup("flowllm-emulator") is not None  # so cost shows offline too


def _outcome(task_id: str, level: int, correct: bool, **kw) -> TaskOutcome:
    base = {
        "status": COMPLETED,
        "answer": "a",
        "ground_truth": "a" if correct else "b",
        "correct": correct,
        "turns": 2,
        "usage": Usage(
            input_tokens=1000, output_tokens=100, cache_read_tokens=400, cache_write_tokens=200, reasoning_tokens=30
        ),
        "level": level,
        "tool_calls": 3,
        "bad_tool_calls": 1,
        "repairs": {"strict": 2, "json5": 0, "failed": 1},
    }
    base.update(kw)
    return TaskOutcome(task_id=task_id, **base)


def _summary(interrupted: bool = False) -> dict:
    outcomes = [
        _outcome("a", 1, True),
        _outcome("b", 1, False),
        _outcome("c", 2, True, attempts=2),
        _outcome(
            "d",
            2,
            False,
            status=FAILED,
            turns=0,
            usage=Usage(),
            tool_calls=0,
            bad_tool_calls=0,
            repairs={},
            error="FileNotFoundError: attachment 'x.pdf' is missing from the dataset folder",
        ),
    ]
    table = PriceTable.from_mapping(
        {"models": {"m": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}}}
    )
    return summarize(
        outcomes, total=5, wall_seconds=12.5, interrupted=interrupted, resumed=1, model="m", prices=table, attempts=2
    ).to_dict()


def test_summary_counts() -> None:
    s = _summary()
    assert (s["tasks"], s["finished"], s["completed"], s["failed"], s["unfinished"]) == (5, 4, 3, 1, 1)
    # Over the scored finished tasks, as every breakdown counts: the unfinished task is in neither.
    assert (s["correct"], s["scored"], s["unscored"], s["accuracy"]) == (2, 4, 0, 0.5)
    assert s["by_level"] == {
        "1": {"tasks": 2, "scored": 2, "unscored": 0, "correct": 1, "accuracy": 0.5},
        "2": {"tasks": 2, "scored": 2, "unscored": 0, "correct": 1, "accuracy": 0.5},
    }
    # 9 parsed calls + 3 malformed blocks were made; 3 of the 9 failed repair.
    assert (s["tool_calls_made"], s["tool_calls_parsed"], s["parse_rate"]) == (12, 6, 0.5)
    assert s["repairs"] == {"failed": 3, "json5": 0, "strict": 6}
    assert s["tokens"] == {
        "input_uncached": 1200,
        "cache_read": 1200,
        "cache_write": 600,
        "output": 300,
        "reasoning": 90,
        "total": 3300,
    }
    expected = (1200 * 3 + 1200 * 0.3 + 600 * 3.75 + 300 * 15) / 1e6
    assert s["cost_usd"] == pytest.approx(expected) and s["cost"]["model"] == "m"
    assert s["attempts"] == 2 and s["attempts_used"] == 5 and s["resumed"] == 1
    assert s["interrupted"] is False


def test_unpriced_model_says_why() -> None:
    s = summarize([], total=0, wall_seconds=0, interrupted=False, model="mystery", prices=PriceTable({}, "p.yaml"))
    s = s.to_dict()
    assert s["cost_usd"] is None and s["cost"]["note"] == "no price for 'mystery' in p.yaml"
    assert s["accuracy"] is None and s["parse_rate"] is None  # nothing scored: not known


def test_printed_table() -> None:
    console = Console(record=True, width=200)
    s = _summary(interrupted=True)
    print_summary(s, [], Path("runs/x"), console=console)
    text = console.export_text()
    assert "interrupted" in text and "rerun with the same hydra.run.dir" in text
    # Counted as the levels are: over the scored finished tasks, saying what is left out.
    assert "50.0% (2/4 scored); 1 unfinished, not counted" in text and "level 1" in text and "level 2" in text
    assert "12 / 6 (50.0%)" in text  # tool calls made / parsed
    assert "failed: 3, json5: 0, strict: 6" in text
    assert f"${s['cost_usd']:.4f} (m)" in text
    assert "1 unfinished" in text and "k=2" in text
