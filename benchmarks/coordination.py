"""Shared rate limits and budget across processes: two shard processes of the offline sample under one
``provider.rate_limit.requests_per_minute`` (then one ``experiment.budget.cost_usd``), with and without
``experiment.coordination`` (a Redis started here on a free loopback port), measured on their ledgers.

    python -m benchmarks.coordination [--rpm 120] [--budget 0.02]

Without coordination each shard holds the limit alone, so the pair sends at up to twice it and spends up to two
budgets; with Redis the pair holds them together. Sustained = the requests after the first burst over the time
they took (the ledgers' send times of both shards); spent = the ledgers' billed cost. Needs Debian's redis-server.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/coordination.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import md_table, python

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _starts(folder: Path) -> list[float]:
    lines = (json.loads(raw) for raw in (folder / "usage.jsonl").read_text().splitlines())
    return [float(line["ts"]) for line in lines if line.get("type") == "attempt"]


def _spent(folder: Path) -> float:
    lines = (json.loads(raw) for raw in (folder / "usage.jsonl").read_text().splitlines())
    return sum(float(line.get("cost_usd") or 0.0) for line in lines if line.get("type") == "attempt")


def _start_pair(scratch: Path, name: str, setting: str, url: str | None) -> None:
    procs = []
    for index in range(2):
        args = [python(), "-m", "flowllm", "progress=false", f"experiment.shard={index}/2", setting]
        args += ["experiment.max_concurrent=2", f"hydra.run.dir={scratch / f'{name}{index}'}"]
        if url is not None:
            args.append(f"experiment.coordination='{url}?run={name}'")
        procs.append(subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if any(proc.wait(timeout=900) not in (0, 3) for proc in procs):  # 3: the budget ended the run
        raise SystemExit(f"a shard of {name} failed")


def _budget_pair(scratch: Path, name: str, budget: float, url: str | None) -> float:
    """Two shards at once under one budget each (or one shared): what they spent together."""
    _start_pair(scratch, name, f"experiment.budget.cost_usd={budget}", url)
    return sum(_spent(scratch / f"{name}{index}") for index in range(2))


def _pair(scratch: Path, name: str, rpm: float, url: str | None) -> tuple[int, float, float]:
    """Two shards at once: (requests, sustained req/s, wall s)."""
    _start_pair(scratch, name, f"provider.rate_limit.requests_per_minute={rpm}", url)
    starts = sorted(t for index in range(2) for t in _starts(scratch / f"{name}{index}"))
    burst = max(1, int(rpm / 60))
    span = starts[-1] - starts[burst - 1] if len(starts) > burst else 0.0
    sustained = (len(starts) - burst) / span if span > 0 else float("inf")
    return len(starts), sustained, starts[-1] - starts[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rpm", type=float, default=120.0)
    parser.add_argument("--budget", type=float, default=0.02)
    args = parser.parse_args(argv)
    server = shutil.which("redis-server")
    if server is None:
        print("redis-server is not installed (Debian package redis-server)", file=sys.stderr)
        return 2
    port = _free_port()
    redis = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        with tempfile.TemporaryDirectory(prefix="flowllm-coordination-") as scratch:
            rows = []
            for name, url in (("alone", None), ("shared", f"redis://127.0.0.1:{port}/0")):
                requests, sustained, wall = _pair(Path(scratch), name, args.rpm, url)
                limit = args.rpm / 60
                ratio = sustained / limit
                spent = _budget_pair(Path(scratch), f"{name}-budget", args.budget, url)
                rate_cells = [f"{limit:.2f}", f"{sustained:.2f}", f"{ratio:.2f}", f"{wall:.1f}"]
                rows.append([name, requests, *rate_cells, f"${args.budget:g}", f"${spent:.4f}"])
    finally:
        redis.terminate()
        redis.wait(timeout=30)
    headers = ["limits", "requests", "limit (req/s)", "sustained (req/s)", "x the limit", "span (s)"]
    headers += ["budget", "spent together"]
    print(md_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
