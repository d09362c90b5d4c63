"""The run folder's records (flowllm/rundir/results.py): old runs load and round-trip unchanged, a fresh run's
files carry the format version and validate against the shipped JSON Schema, which is the generated one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from flowllm.rundir.record_base import Record, RecordFormatError
from flowllm.rundir.results import FORMAT_VERSION, LedgerLine, RunSummary, TaskResult
from flowllm.rundir.schema_gen import SCHEMA_DIR, SCHEMAS, render, schema_of


def run_files(root: Path) -> Iterator[tuple[type[Record], Path, dict[str, Any]]]:
    """(record class, file, JSON object) of every summary.json, result.json and ledger line under ``root``."""
    for path in sorted(root.rglob("summary.json")):
        yield RunSummary, path, json.loads(path.read_text(encoding="utf-8"))
    for path in sorted(root.rglob("result.json")):
        yield TaskResult, path, json.loads(path.read_text(encoding="utf-8"))
    for path in sorted(root.rglob("*usage.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            yield LedgerLine, path, json.loads(line)


def test_the_shipped_schemas_are_the_generated_ones() -> None:
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.json")) == sorted(SCHEMAS)
    for name, cls in SCHEMAS.items():
        shipped = (SCHEMA_DIR / name).read_text(encoding="utf-8")
        assert shipped == render(cls), f"{name} is stale: python -m flowllm.rundir.schema_gen writes it again"


def test_every_old_record_loads_and_round_trips_unchanged(old_runs: Path) -> None:
    counts = {RunSummary: 0, TaskResult: 0, LedgerLine: 0}
    for cls, path, data in run_files(old_runs):
        record = cls.from_dict(data)
        assert record.to_dict() == data, path
        assert not record.extra, f"{path}: keys the record does not know: {sorted(record.extra)}"
        counts[cls] += 1
    assert counts[RunSummary] == 6 and counts[TaskResult] >= 60 and counts[LedgerLine] > 100, counts
    summary = RunSummary.from_dict(json.loads((old_runs / "fork" / "summary.json").read_text(encoding="utf-8")))
    assert summary.format_version == 0  # written before the version existed
    assert summary.fork is not None and summary.fork.live_calls is not None
    assert summary.stats is not None and summary.stats.epochs == 1 and summary.scored_count == 10


def test_old_and_fresh_files_validate_against_the_schema(old_runs: Path, sample_run: Path) -> None:
    validators = {cls: jsonschema.Draft202012Validator(schema_of(cls)) for cls in SCHEMAS.values()}
    for root in (old_runs, sample_run):
        for cls, path, data in run_files(root):
            errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validators[cls].iter_errors(data)]
            assert errors == [], f"{path}: {errors[:3]}"


def test_a_fresh_run_writes_the_format_version(sample_run: Path) -> None:
    seen = set()
    for cls, path, data in run_files(sample_run):
        if cls is LedgerLine:
            continue
        assert data["format_version"] == FORMAT_VERSION, path
        assert cls.from_dict(data).to_dict() == data, path
        seen.add(cls)
    assert seen == {RunSummary, TaskResult}


def test_unknown_keys_are_kept_and_missing_ones_take_defaults() -> None:
    data = {"task_id": "t1", "status": "completed", "answer": "4", "written_by_a_newer_flowllm": {"x": 1}}
    result = TaskResult.from_dict(data)
    assert result.extra == {"written_by_a_newer_flowllm": {"x": 1}}
    assert (result.turns, result.correct, result.attempts, result.format_version) == (0, None, 1, 0)
    assert result.to_dict() == data
    result.verdict = "CORRECT"  # set after loading: written though the file had no such key
    assert result.to_dict() == {**data, "verdict": "CORRECT"}


def test_a_built_result_writes_what_its_status_and_epochs_need() -> None:
    done = TaskResult(task_id="t1", status="completed").to_dict()
    assert done["format_version"] == FORMAT_VERSION
    assert not {"replay", "epochs", "limit", "halt_detail", "scored"} & set(done)
    limited = TaskResult(task_id="t1", status="budget", epochs=2, limit=None).to_dict()
    assert limited["limit"] is None and limited["scored"] is True and limited["epochs"] == 2
    assert "score" in limited and "epoch_log" in limited


def test_a_built_ledger_line_writes_the_keys_of_its_type() -> None:
    line = LedgerLine(type="skip", call=3, provider="p", reason="breaker open", task_id="t", agent="main", turn=1)
    assert line.to_dict() == {
        "type": "skip",
        "call": 3,
        "task_id": "t",
        "agent": "main",
        "turn": 1,
        "provider": "p",
        "reason": "breaker open",
    }
    breaker = LedgerLine.from_dict({"type": "breaker", "provider": "p", "from": "closed", "to": "open", "at": 1.0})
    assert (breaker.from_state, breaker.to_state, breaker.at) == ("closed", "open", 1.0)
    assert LedgerLine(type="attempt").to_dict()["error"] is None  # an attempt line always says its error


def test_a_file_that_is_not_an_object_is_a_one_line_error() -> None:
    with pytest.raises(RecordFormatError, match="RunSummary: expected a JSON object, got list"):
        RunSummary.from_dict([1, 2])


def test_a_job_that_could_not_run_writes_its_status_and_error_only() -> None:
    data = RunSummary.job_error("dataset.path: no such file").to_dict()
    assert data == {"format_version": FORMAT_VERSION, "status": "error", "error": "dataset.path: no such file"}
    assert RunSummary.from_dict(data).scored_count == 0
