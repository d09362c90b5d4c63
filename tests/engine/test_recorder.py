"""The recorder: layout, redaction of secrets, atomic writes, snapshot modes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from flowllm.core.types import ModelResponse, Usage
from flowllm.engine import Recorder, TurnContext, build_pipeline, make_runner
from flowllm.engine.recorder import REDACTED, Redactor, atomic_write, read_json

T = "tests.engine.nodes_for_tests"
KEY = "sk-ant-test-0123456789abcdefghij"


def test_secret_values_and_credential_fields_never_reach_disk(tmp_path: Path) -> None:
    with Recorder(tmp_path, secrets=[KEY]) as rec:
        rec.write_json(
            tmp_path / "x.json",
            {
                "headers": {"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "accept": "json"},
                "note": f"the key was {KEY} in a sentence",
                "api_key_env": "ANTHROPIC_API_KEY",
            },
        )
    text = (tmp_path / "x.json").read_text()
    assert KEY not in text
    data = read_json(tmp_path / "x.json")
    assert data["headers"] == {"Authorization": REDACTED, "x-api-key": REDACTED, "accept": "json"}
    assert data["note"] == f"the key was {REDACTED} in a sentence"
    assert data["api_key_env"] == "ANTHROPIC_API_KEY"  # the variable's name is not a secret


def test_dataclasses_serialise_through_to_dict() -> None:
    resp = ModelResponse(text="hi", stop_reason="end_turn", usage=Usage(input_tokens=3, output_tokens=1))
    data = Redactor().dumps({"response": resp})
    assert b'"input_tokens": 3' in data and b'"text": "hi"' in data


def test_atomic_write_leaves_no_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.json"
    atomic_write(target, b"first")
    atomic_write(target, b"second")
    assert target.read_bytes() == b"second"
    assert [p.name for p in target.parent.iterdir()] == ["b.json"]  # no temp files left behind


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "r.json"
    atomic_write(target, b"old")

    def refuse(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"


async def _run_turn(rec: Recorder, task: str) -> None:
    pipeline = build_pipeline({"add": {"_target_": f"{T}.Add"}}, provided=("value",))
    await make_runner("graph").run(pipeline, {"value": 1}, TurnContext(task, 1), rec)


@pytest.mark.parametrize(
    ("snapshot", "status", "kept"),
    [
        ("all", "completed", True),
        ("errors", "completed", False),
        ("errors", "failed", True),
        ("none", "failed", False),
    ],
)
async def test_snapshot_modes(tmp_path: Path, snapshot: str, status: str, kept: bool) -> None:
    with Recorder(tmp_path, snapshot=snapshot) as rec:
        await _run_turn(rec, "t1")
        rec.finish_task("t1", {"task_id": "t1", "status": status})
    node_dir = tmp_path / "tasks" / "t1" / "turn_001" / "01_add"
    assert (node_dir / "output.json").exists() is kept
    assert read_json(tmp_path / "tasks" / "t1" / "result.json")["status"] == status


def test_unknown_snapshot_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="all, errors, none"):
        Recorder(tmp_path, snapshot="some")


async def test_flushed_waits_on_the_loop_for_every_write(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    files = [tmp_path / "tasks" / f"t{i}" / "result.json" for i in range(200)]
    for i, path in enumerate(files):
        rec.write_json(path, {"i": i})
    await rec.flushed()
    assert all(read_json(path) == {"i": i} for i, path in enumerate(files))
    # A waiter cancelled before the writer got to it leaves the writer working for the next one.
    rec.write_json(files[0], {"i": "again"})
    waiter = asyncio.ensure_future(rec.flushed())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await rec.flushed()
    assert read_json(files[0]) == {"i": "again"}
    rec.close()
    await rec.flushed()  # closed: nothing to wait for


async def test_a_finished_task_writes_its_timing_and_result_whatever_folders_exist(tmp_path: Path) -> None:
    """The writer makes a task's folder with one mkdir where it can: it must still make a missing parent, use an
    existing folder, and fail the task (not claim it written) where a file stands in the folder's place."""
    rec = Recorder(tmp_path / "run", snapshot="none")  # the run's tasks/ folder does not exist yet
    (tmp_path / "run" / "tasks" / "t2").mkdir(parents=True)  # a task whose folder exists (its workspace moved in)
    (tmp_path / "run" / "tasks" / "t3").write_text("not a folder")
    for task in ("t1", "t2", "t3"):
        rec.finish_task(task, {"task_id": task, "status": "completed"}, timing={"wall_seconds": 1.5})
    await rec.flushed()
    for task in ("t1", "t2"):
        folder = tmp_path / "run" / "tasks" / task
        assert read_json(folder / "result.json")["status"] == "completed"
        assert read_json(folder / "timing.json") == {"wall_seconds": 1.5}
        assert rec.task_write_error(task) is None
    assert "could not write" in (rec.task_write_error("t3") or "")
    rec.close()
