"""A run directory that fills up: one clear line, no traceback storm, and a resume that works once space is back.

The full disk is real: a tmpfs of a few hundred KB mounted as the run directory (needs root and mount; the
test skips saying so elsewhere). The ledger's reader is also tested on a line cut mid-write.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from flowllm.providers.ledger import UsageLedger
from tests.experiment.helpers import run_flowllm


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount_point)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _dataset(folder: Path) -> Path:
    folder.mkdir()
    rows = [{"task_id": f"t{i}", "Question": f"q{i}", "Level": 1, "Final answer": "none"} for i in range(4)]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    padding = "lorem ipsum " * 400  # ~5 KB a reply, recorded in several node files
    (folder / "script.yaml").write_text(yaml.safe_dump({"default": [{"text": padding + "\\boxed{none}"}]}))
    return folder


def _run(dataset: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return run_flowllm(
        "+experiment=gaia",
        "progress=false",
        f"dataset.path={dataset}",
        f"provider.emulator_script={dataset / 'script.yaml'}",
        f"hydra.run.dir={run_dir}",
        "experiment.max_concurrent=1",
        "tools=none",
        timeout=300,
    )


def test_a_full_run_directory_fails_with_one_line_and_resumes_when_space_is_back(
    tmp_path: Path, small_disk: Path
) -> None:
    dataset = _dataset(tmp_path / "data")
    run_dir = small_disk / "run"
    proc = _run(dataset, run_dir)
    output = proc.stdout + proc.stderr
    # 130: the summary landed and says the run was cut short; 3 or 4 (a run error after tasks ran, never 2:
    # "nothing ran"): even summary.json could not be written.
    assert proc.returncode in (3, 4, 130), output
    assert "Traceback" not in output
    assert "No space left on device" in output
    # The first failure, the stop, and perhaps the summary: never one line per file.
    assert output.count("No space left on device") <= 3, output
    assert "no new tasks start" in output
    # What landed is readable: the ledger (even if cut) and every result.json.
    UsageLedger.read(run_dir / "usage.jsonl")
    finished = [json.loads(p.read_text()) for p in run_dir.glob("tasks/*/result.json")]
    assert len(finished) < 4
    completed_before = sum(1 for r in finished if r["status"] == "completed")

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    proc = _run(dataset, run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] == 4 and summary["correct"] == 4
    assert summary["resumed"] == completed_before


def test_the_ledger_reader_skips_and_reports_a_cut_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "usage.jsonl"
    good = {"type": "call", "provider": "p", "outcome": "ok", "call": 1, "id": str(uuid.uuid4())}
    later = {"type": "call", "provider": "p", "outcome": "ok", "call": 2, "nested": {"a": {"b": 1}}}
    cut = orjson.dumps({**good, "call": 9, "usage": {"input_tokens": 5}})[:-9]
    # A cut line, then (a resumed session) a whole line appended right after it, then a cut last line.
    path.write_bytes(orjson.dumps(good) + b"\n" + cut + orjson.dumps(later) + b"\n" + cut)
    ledger = UsageLedger.read(path)
    assert [line.call for line in ledger.lines] == [1, 2]
    assert ledger.broken_lines == [3]
    assert "skipped 1 unreadable line(s) (3)" in caplog.text
    assert ledger.summary()  # and the summary is built from what was readable
