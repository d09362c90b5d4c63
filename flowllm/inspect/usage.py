"""``python -m flowllm.inspect usage RUN [RUN...]``: the usage ledgers of several runs, summed.

Each run's ``usage.jsonl`` counts its attempts in buckets (hour, model, agent, user), and its
``judge_usage.jsonl`` the judge's (agent ``judge``): a run's total is every call it was billed for. A team sharing a
provider account runs many experiments; this adds their buckets together so "who spent what, on which model,
when" is one table. ``--by`` chooses the dimensions kept (the others are summed over)::

    python -m flowllm.inspect usage runs/2026-12-02/*                 # every bucket
    python -m flowllm.inspect usage runs/multirun/2026-12-02 --by user    # one line per user
    python -m flowllm.inspect usage RUN_A RUN_B --by user,model --json
    python -m flowllm.inspect usage RUN --cache     # and per task: cache hit rate, input cost against the bound

A folder without ``usage.jsonl`` of its own is searched below (a multirun folder holds one per job). A file is
read only if it is a ``usage.jsonl``: the other files a shell glob brings in (``runs/sweep1/*`` names the sweep's
``multirun.yaml`` and tables beside its job folders) are left out and named once. Cost
is summed from the ledger's own prices; attempts of an unpriced model are counted and shown, never priced at
zero in silence. Exit status: 0 done, 2 bad usage or no ledger found.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from flowllm.errors import CliError
from flowllm.providers.ledger import TOKEN_KINDS, Tally, UsageLedger
from flowllm.rundir.layout import JUDGE_LEDGER_FILE, LEDGER_FILE
from flowllm.rundir.results import LedgerLine
from flowllm.spend.run_cache import RunCache, run_cache

DIMENSIONS = ("hour", "user", "model", "agent")
LEDGER_NAMES = (LEDGER_FILE, JUDGE_LEDGER_FILE)  # a run's ledgers: the agent's calls, the judge's


class UsageInputError(CliError):
    """A path that holds no usage ledger, or bad arguments: exit status 2."""


@dataclass
class UsageTotals:
    ledgers: list[Path]
    dims: tuple[str, ...]
    buckets: dict[tuple[str, ...], Tally] = field(default_factory=dict)
    total: Tally = field(default_factory=Tally)
    skipped: list[Path] = field(default_factory=list)  # files given that are not ledgers (a glob's extras)

    @property
    def runs(self) -> int:
        """The run folders the ledgers are in (a judged run has two: the agent's and the judge's)."""
        return len({p.parent for p in self.ledgers})

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "ledgers": [str(p) for p in self.ledgers],
            "by": list(self.dims),
            "buckets": [
                {**dict(zip(self.dims, key, strict=True)), **tally.to_dict()}
                for key, tally in sorted(self.buckets.items())
            ],
            "total": self.total.to_dict(),
            "skipped": [str(p) for p in self.skipped],
        }


def find_ledgers(paths: Sequence[str | Path], skipped: list[Path] | None = None) -> list[Path]:
    """The ``usage.jsonl`` of each path (a run folder, a multirun folder, or the file itself), each once.

    A file not named ``usage.jsonl`` is no ledger: it is appended to ``skipped`` when given (a glob over a sweep
    folder), else refused."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_file() and path.name not in LEDGER_NAMES:
            if skipped is None:
                raise UsageInputError(f"{raw}: not a usage ledger (give a run folder or its {LEDGER_FILE})")
            skipped.append(path)
            continue
        if path.is_file():
            candidates = [path]
        elif (path / LEDGER_FILE).is_file():
            candidates = [path / name for name in LEDGER_NAMES if (path / name).is_file()]
        elif path.is_dir():
            candidates = sorted(found for name in LEDGER_NAMES for found in path.rglob(name))
        else:
            raise UsageInputError(f"{raw}: no such file or folder")
        if not candidates:
            raise UsageInputError(f"{raw}: no {LEDGER_FILE} in it or below it (is it a flowllm run folder?)")
        for candidate in candidates:
            resolved = candidate.resolve()
            if resolved not in found:
                found.append(resolved)
    if not found:
        raise UsageInputError(f"no {LEDGER_FILE} in {', '.join(map(str, paths))} (are they flowllm run folders?)")
    return found


def _read(path: Path) -> list[LedgerLine]:
    try:
        return UsageLedger.read(path).attempt_lines()
    except orjson.JSONDecodeError as exc:
        raise UsageInputError(f"{path}: not a usage ledger ({exc})") from None


def _dimension(line: LedgerLine, name: str) -> str | None:
    """The line's value of a ``--by`` dimension (one of ``DIMENSIONS``)."""
    values = {"hour": line.hour, "user": line.user, "model": line.model, "agent": line.agent}
    return values[name]


def sum_usage(paths: Sequence[str | Path], by: Sequence[str] = DIMENSIONS) -> UsageTotals:
    """Every attempt of every ledger under ``paths``, tallied per bucket of the dimensions ``by``."""
    dims = tuple(by) or DIMENSIONS
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown:
        raise UsageInputError(f"--by: unknown dimension(s) {', '.join(unknown)} (known: {', '.join(DIMENSIONS)})")
    skipped: list[Path] = []
    totals = UsageTotals(find_ledgers(paths, skipped), dims, skipped=skipped)
    for ledger in totals.ledgers:
        for line in _read(ledger):
            key = tuple(str(_dimension(line, d) or "(unknown)") for d in dims)
            totals.buckets.setdefault(key, Tally()).add(line)
            totals.total.add(line)
    return totals


def _cost(tally: Tally) -> str:
    if tally.unpriced and not tally.cost_usd:
        return "unknown"
    text = f"${tally.cost_usd:.4f}"
    return f"{text} + {tally.unpriced} unpriced" if tally.unpriced else text


def _row(tally: Tally) -> list[str]:
    tokens = tally.tokens
    return [
        str(tally.attempts),
        str(tally.successes),
        str(tally.failures),
        f"{tokens['input_tokens']:,}",
        f"{tokens['output_tokens']:,}",
        f"{sum(tokens[k] for k in TOKEN_KINDS if k not in ('input_tokens', 'output_tokens')):,}",
        _cost(tally),
    ]


def render(totals: UsageTotals, console: Console) -> None:
    table = Table(title=f"usage of {totals.runs} run(s), by {', '.join(totals.dims)}", title_justify="left")
    for dim in totals.dims:
        table.add_column(dim)
    for name in ("attempts", "ok", "failed", "input", "output", "cache/reasoning"):
        table.add_column(name, justify="right")
    table.add_column("cost")
    for key, tally in sorted(totals.buckets.items()):
        table.add_row(*key, *_row(tally))
    table.add_section()
    table.add_row("total", *([""] * (len(totals.dims) - 1)), *_row(totals.total), style="bold")
    console.print(table)
    if totals.skipped:
        names = ", ".join(p.name for p in totals.skipped)
        console.print(f"left out {len(totals.skipped)} file(s) that are not usage ledgers: {names}")
    estimated = totals.total.estimated
    if estimated:
        console.print(f"{estimated} successful attempt(s) had estimated token counts (the server reported none)")


def _ratio(row: dict[str, Any]) -> str:
    return f"{row['over_bound']:.2f}x" if row["over_bound"] is not None else "-"


def render_cache(report: RunCache, console: Console) -> None:
    """Per task: the cache hit rate, and the input billed against the cache-optimal bound (spend/run_cache.py)."""
    data = report.to_dict()
    table = Table(
        title=f"prompt cache of {report.run_dir.name} ({report.model or 'unknown model'})", title_justify="left"
    )
    for name in ("task", "input", "cache read", "cache write", "hit rate", "billed input", "bound", "billed / bound"):
        table.add_column(name, justify="left" if name == "task" else "right")

    def cells(row: dict[str, Any]) -> list[str]:
        usd = [f"${row[k]:.4f}" if row[k] is not None else "unpriced" for k in ("billed_input_usd", "bound_input_usd")]
        rate = f"{row['hit_rate']:.1%}" if row["hit_rate"] is not None else "-"
        counts = [f"{row[k]:,}" for k in ("input_tokens", "cache_read_tokens", "cache_write_tokens")]
        if row.get("cache_write_1h_tokens"):  # the one-hour writes, billed at their own price
            counts[2] += f" (1h {row['cache_write_1h_tokens']:,})"
        return [row["task_id"], *counts, rate, *usd, _ratio(row)]

    for row in data["tasks"]:
        table.add_row(*cells(row))
    table.add_section()
    table.add_row(*cells({**data["total"], "task_id": "run"}), style="bold")
    console.print(table)


def main(argv: Sequence[str], console: Console | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flowllm.inspect usage", description="Sum the usage ledgers of several runs."
    )
    parser.add_argument("runs", nargs="+", help="run folders, multirun folders or usage.jsonl files")
    parser.add_argument(
        "--by", default=",".join(DIMENSIONS), help=f"dimensions kept, comma-separated (default {','.join(DIMENSIONS)})"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--cache", action="store_true", help="per task: cache hit rate and input cost against the cache-optimal bound"
    )
    ns = parser.parse_args(list(argv))
    try:
        totals = sum_usage(ns.runs, [d.strip() for d in ns.by.split(",") if d.strip()])
    except UsageInputError as exc:
        print(f"flowllm.inspect: error: {exc}", file=sys.stderr)
        return exc.exit_code
    runs = [run_cache(p.parent) for p in totals.ledgers if p.name == LEDGER_FILE] if ns.cache else []
    if ns.json:
        data = totals.to_dict()
        if ns.cache:
            data["cache"] = [report.to_dict() for report in runs]
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    else:
        out = console or Console(highlight=False, width=140)
        render(totals, out)
        for report in runs:
            render_cache(report, out)
    return 0
