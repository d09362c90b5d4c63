"""The ledger's "user" dimension is a run setting, and ``python -m flowllm.inspect usage`` sums runs.

Two real runs through the command line (the offline emulator, one task each): one names its user with
``experiment.user``, the other gets it from ``$FLOWLLM_USER``. Their buckets are then summed by the inspect
command, as a team sharing a provider account would.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flowllm.inspect.usage import sum_usage
from flowllm.providers.ledger import UsageLedger, resolve_user
from tests.appfork import run_app

ROOT = Path(__file__).resolve().parents[2]
TASK = "dataset.task_ids=[sample-02-word-count]"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert args[0] == "-m"
    return run_app(list(args[2:]), module=args[1], cwd=ROOT, timeout=240, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("usage")
    ann, bob = base / "ann", base / "bob"
    common = ["-m", "flowllm", "progress=false", "tools=none", "agent.max_turns=1", TASK]
    done = _cli(*common, "experiment.user=ann", f"hydra.run.dir={ann}", env={"FLOWLLM_USER": "not-ann"})
    assert done.returncode == 0, done.stderr
    done = _cli(*common, f"hydra.run.dir={bob}", env={"FLOWLLM_USER": "bob"})
    assert done.returncode == 0, done.stderr
    return ann, bob


def test_the_user_comes_from_the_setting_then_the_environment(two_runs: tuple[Path, Path]) -> None:
    ann, bob = two_runs
    assert {a["user"] for a in UsageLedger.read(ann / "usage.jsonl").attempts()} == {"ann"}
    assert {a["user"] for a in UsageLedger.read(bob / "usage.jsonl").attempts()} == {"bob"}
    assert resolve_user(None, {}) not in ("", "ann", "bob")  # the login name (or "unknown")
    assert resolve_user("  ", {"FLOWLLM_USER": "eve"}) == "eve"


def test_inspect_usage_sums_buckets_across_runs(two_runs: tuple[Path, Path]) -> None:
    ann, bob = two_runs
    done = _cli("-m", "flowllm.inspect", "usage", str(ann), str(bob), "--by", "user", "--json")
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    buckets = {b["user"]: b for b in out["buckets"]}
    assert set(buckets) == {"ann", "bob"}
    singles = {who: UsageLedger.read(run / "usage.jsonl").summary() for who, run in (("ann", ann), ("bob", bob))}
    for who, summary in singles.items():
        assert buckets[who]["attempts"] == summary["attempts"] > 0
        assert buckets[who]["tokens"] == summary["tokens"]
    assert out["total"]["attempts"] == sum(s["attempts"] for s in singles.values())
    both = {k: singles["ann"]["tokens"][k] + singles["bob"]["tokens"][k] for k in singles["ann"]["tokens"]}
    assert out["total"]["tokens"] == both
    # The parent folder is searched (a multirun folder), each ledger once even if named twice.
    again = sum_usage([ann.parent, ann], by=["user", "model"])
    assert len(again.ledgers) == 2 and again.total.attempts == out["total"]["attempts"]
    table = _cli("-m", "flowllm.inspect", "usage", str(ann.parent), "--by", "user")
    assert table.returncode == 0 and "ann" in table.stdout and "bob" in table.stdout and "total" in table.stdout


def test_a_folder_without_a_ledger_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _cli("-m", "flowllm.inspect", "usage", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no usage.jsonl" in done.stderr
    bad = _cli("-m", "flowllm.inspect", "usage", str(tmp_path), "--by", "planet")
    assert bad.returncode == 2


def test_a_glob_over_a_sweep_folder_reads_only_its_jobs_ledgers(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    ann, bob = two_runs
    sweep = tmp_path / "sweep1"
    for job, run in (("0", ann), ("1", bob)):
        (sweep / job).mkdir(parents=True)
        (sweep / job / "usage.jsonl").write_bytes((run / "usage.jsonl").read_bytes())
    (sweep / "multirun.yaml").write_text("hydra:\n  mode: MULTIRUN\n")
    (sweep / "sweep_summary.json").write_text(json.dumps({"jobs": [{"accuracy": 1.0}] * 2}))
    globbed = sorted(str(p) for p in sweep.iterdir())  # what the shell makes of runs/sweep1/*
    done = _cli("-m", "flowllm.inspect", "usage", *globbed, "--by", "user")
    assert done.returncode == 0, done.stderr
    assert "usage of 2 run(s)" in done.stdout and "unreadable" not in done.stdout + done.stderr
    assert "left out 2 file(s) that are not usage ledgers: multirun.yaml, sweep_summary.json" in done.stdout
    only_files = _cli("-m", "flowllm.inspect", "usage", str(sweep / "multirun.yaml"))
    assert only_files.returncode == 2 and "no usage.jsonl" in only_files.stderr
