"""LedgerTail: the parent of several workers follows the run's ledger as the workers append to it."""

from __future__ import annotations

from pathlib import Path

import orjson

from flowllm.providers.ledger import LedgerTail
from flowllm.run.progress import LedgerTally


def attempt(tokens: int, cost: float) -> bytes:
    line = {"type": "attempt", "outcome": "ok", "usage": {"input_tokens": tokens, "output_tokens": 1}, "cost_usd": cost}
    return orjson.dumps(line) + b"\n"


def test_appended_lines_are_read_as_they_come_and_a_half_written_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    tail = LedgerTail(path)
    assert tail.lines == []  # no file yet: nothing, no error
    path.write_bytes(attempt(10, 0.5))
    tally = LedgerTally(tail)
    tally.poll()
    assert (tally.calls, tally.tokens, tally.cost_usd) == (1, 11, 0.5)
    second = attempt(20, 0.25)
    with path.open("ab") as fh:  # another worker is in the middle of writing a line
        fh.write(second[:15])
    tally.poll()
    assert tally.calls == 1
    with path.open("ab") as fh:
        fh.write(second[15:] + b'{"type": "attempt", "cut by a kill\n' + attempt(5, 0.0))
    tally.poll()
    assert (tally.calls, tally.tokens, tally.cost_usd) == (3, 11 + 21 + 6, 0.75)
