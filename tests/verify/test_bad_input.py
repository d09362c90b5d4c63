"""``flowllm verify`` given what is not an auditable run: one line naming the file (and line), exit 2, and
nothing in the folder changed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from flowllm.exit_codes import ExitCode
from flowllm.verify.cli import main as verify_main
from tests.verify.old_runs import unpack_old_runs


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return unpack_old_runs(tmp_path, only="plain") / "plain"


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def refused(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = tree_digest(folder) if folder.is_dir() else {}
    code = verify_main([str(folder)])
    out = capsys.readouterr()
    assert code == ExitCode.CONFIG
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert (tree_digest(folder) if folder.is_dir() else {}) == before  # verify never writes into the run
    return lines[0]


def test_a_folder_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert "is not a run folder: it has no .hydra/config.yaml" in refused(tmp_path, capsys)


def test_a_path_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "is not a folder" in refused(tmp_path / "nowhere", capsys)


def test_a_truncated_result(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run / "tasks" / "sample-03-percentage" / "result.json"
    result.write_bytes(result.read_bytes()[:40])
    line = refused(run, capsys)
    assert "tasks/sample-03-percentage/result.json is not valid JSON" in line


def test_a_ledger_line_that_does_not_parse(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = run / "usage.jsonl"
    lines = ledger.read_text().splitlines()
    lines[4] = lines[4][:30]
    ledger.write_text("\n".join(lines) + "\n")
    assert "usage.jsonl: line 5 does not parse" in refused(run, capsys)


def test_a_run_without_its_summary(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "summary.json").unlink()
    assert "has no summary.json" in refused(run, capsys)


def test_a_dataset_that_cannot_be_read(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = verify_main([str(run), "--dataset", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG
    assert "the run's dataset cannot be read" in err and "--dataset PATH" in err
