"""``python -m benchmarks --only ...`` merges the sections it ran into the results file instead of replacing it, and
a ``--quick`` run never writes over the measured figures."""

from __future__ import annotations

import pytest

from benchmarks.common import Section, Target, md_table
from benchmarks.merge import merge_sections, split_sections
from benchmarks.run import RESULTS, merge_note
from benchmarks.run import main as run_main

TARGET_HEADERS = ["section", "target", "wanted", "measured", ""]


def results_file() -> str:
    targets = md_table(
        TARGET_HEADERS,
        [
            ["Alpha", "a fast", "<= 1x", "0.5x", "met"],
            ["Beta", "b fast", "<= 1x", "2x", "**not met**"],
            ["Beta", "b small", "< 1 MB", "0.5 MB", "met"],
            ["Gamma", "g fast", "<= 1x", "0.9x", "met"],
        ],
    )
    return "\n".join(
        [
            "# flowllm benchmarks",
            "",
            "Written by `python -m benchmarks` on 2026-12-01 10:00 UTC in 9.0 minutes.",
            "",
            "## Machine",
            "",
            md_table(["", ""], [["cpu", "old cpu"]]),
            "",
            "## Targets",
            "",
            "What each section aims at.",
            "",
            targets,
            "",
            "## Alpha",
            "",
            "alpha's old figures",
            "",
            "## Beta",
            "",
            "beta's old figures",
            "",
            "## Gamma",
            "",
            "gamma's old figures",
            "",
        ]
    )


def test_the_sections_run_replace_theirs_and_every_other_stays() -> None:
    beta = Section("Beta", "beta's new figures", targets=[Target("b fast", "<= 1x", "0.8x", True)])
    delta = Section("Delta", "a section the file did not have", targets=[Target("d fast", "<= 1x", "3x", False)])
    merged = merge_sections(results_file(), [beta, delta], "_run on its own_")

    head, sections = split_sections(merged)
    assert head.startswith("# flowllm benchmarks") and "2026-12-01 10:00 UTC" in head
    titles = [title for title, _ in sections]
    assert titles == ["Machine", "Targets", "Alpha", "Beta", "Gamma", "Delta"]
    bodies = dict(sections)
    assert "old cpu" in bodies["Machine"]
    assert "alpha's old figures" in bodies["Alpha"] and "gamma's old figures" in bodies["Gamma"]
    assert "beta's old figures" not in merged
    assert bodies["Beta"].lstrip().startswith("_run on its own_") and "beta's new figures" in bodies["Beta"]
    assert "_run on its own_" in bodies["Delta"] and "a section the file did not have" in bodies["Delta"]

    assert bodies["Targets"].lstrip().startswith("What each section aims at.\n\n| section |")
    rows = [line for line in bodies["Targets"].splitlines() if line.startswith("| ")][2:]
    assert [row.split("|")[1:3] for row in rows] == [
        [" Alpha ", " a fast "],
        [" Beta ", " b fast "],  # Beta's two old rows became its one new row, where they were
        [" Gamma ", " g fast "],
        [" Delta ", " d fast "],
    ]
    assert "0.8x | met" in bodies["Targets"] and "2x" not in bodies["Targets"].split("Gamma")[0].split("Beta")[1]


def test_a_merge_of_the_merged_file_changes_only_what_ran_again() -> None:
    beta = Section("Beta", "beta's new figures", targets=[Target("b fast", "<= 1x", "0.8x", True)])
    once = merge_sections(results_file(), [beta], "_first_")
    again = merge_sections(once, [beta], "_first_")
    assert again == once


def test_the_note_names_the_command_the_machine_and_the_revision() -> None:
    info = {"cpu": "AMD EPYC", "cores": "2 usable of 2", "memory": "23.5 GB", "flowllm revision": "abc1234"}
    note = merge_note(["concurrency", "ratelimit"], info, 600.0)
    assert "`python -m benchmarks --only concurrency ratelimit`" in note
    assert "10.0 minutes" in note and "abc1234" in note and "AMD EPYC (2 usable of 2 cores, 23.5 GB)" in note


def test_a_quick_run_never_writes_the_measured_results(capsys: pytest.CaptureFixture[str]) -> None:
    before = RESULTS.read_bytes()
    with pytest.raises(SystemExit) as stopped:
        run_main(["--quick", "--only", "scale"])
    assert stopped.value.code == 2 and "give --output" in capsys.readouterr().err
    assert RESULTS.read_bytes() == before
