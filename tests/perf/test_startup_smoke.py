"""The start-up benchmark (benchmarks/startup.py) runs through ``python -m benchmarks --only startup`` with tiny
sizes and writes its table. Smoke only: one task per run, one run per row; no figure is asserted."""

from __future__ import annotations

import pytest

from benchmarks import run, startup


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> str:
    output = tmp_path_factory.mktemp("bench") / "results.md"
    assert run.main(["--quick", "--only", "startup", "--output", str(output)]) == 0
    return output.read_text(encoding="utf-8")


def table_rows(text: str) -> list[list[str]]:
    section = text.split("## Start-up: CPU per task", 1)[1]
    table = section.split("\n\n")[2]  # heading, intro, then the table
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.splitlines()]


def test_the_section_is_registered_and_written(results: str) -> None:
    assert "## Start-up: CPU per task" in results and "--quick sizes" in results
    assert "## Engine overhead per node" not in results  # --only: that section alone
    assert "| Start-up: CPU per task | CPU per task of the sample, start-up included | < 1 s |" in results


def test_the_table_has_its_columns_and_rows(results: str) -> None:
    header, align, *rows = table_rows(results)
    assert header == [
        "run",
        "tasks",
        "CPU s per task, best of 1",
        "CPU s per run, median (min-max)",
        "wall s, best",
        "completed",
    ]
    assert len(align) == len(header)
    # --quick leaves out the one-task row (every run has one task there); the reference row comes last.
    quick = [v.name for v in startup.VARIANTS if not v.full_only]
    assert [r[0] for r in rows] == [*quick, startup.REFERENCE]
    for row in rows[:-1]:
        assert row[1] == "1" and row[-1] == "all", row  # one task per run, completed
        assert float(row[2]) > 0 and float(row[4]) > 0
    assert rows[-1][1] == rows[-1][2] == rows[-1][-1] == "-"
