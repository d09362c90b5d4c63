"""The benchmark script runs end to end with tiny sizes and writes a complete results file.

Smoke only: the figures of a --quick run mean nothing, so nothing here asserts on a timing. What is asserted is
what a user of ``python -m benchmarks`` would notice if it broke: a section missing, a reference row missing,
a workload that stopped completing its tasks, a table that does not render.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks import overhead, run, startup
from benchmarks.common import Sizes, Stat, md_table
from benchmarks.turn_fixture import trivial_pipeline, turn_inputs, typical_turn
from flowllm.engine import TurnContext, make_runner

pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory: pytest.TempPathFactory) -> str:
    output = tmp_path_factory.mktemp("bench") / "results.md"
    assert run.main(["--quick", "--output", str(output)]) == 0
    return output.read_text(encoding="utf-8")


def test_results_file_has_every_section_and_the_machine(quick_results: str) -> None:
    for heading in (
        "# flowllm benchmarks",
        "## Machine",
        "## Targets",
        "## Engine overhead per node",
        "## Parallel tool dispatch",
        "## Concurrency",
        "## Replay throughput",
        "## Parsing",
        "## Start-up: CPU per task",
        "## Scaling figures and bisect planning",
    ):
        assert heading in quick_results, heading
    assert "| cores |" in quick_results and "| python |" in quick_results
    assert "--quick sizes" in quick_results  # a smoke file never passes for a measurement


def test_references_are_measured_next_to_flowllm(quick_results: str) -> None:
    assert "plain Python loop (reference)" in quick_results
    for runner in ("legacy", "graph", "graph_parallel"):
        assert f"flowllm runner={runner}" in quick_results
    # Peers are optional dev dependencies: either measured or reported as missing, never silently dropped.
    assert "LangGraph" in quick_results and "Haystack" in quick_results


def test_end_to_end_workloads_complete_every_task(quick_results: str) -> None:
    # The concurrency and replay tables end each row with "all" when every task finished with the right answer.
    concurrency = quick_results.split("## Concurrency", 1)[1].split("## Replay", 1)[0]
    replay = quick_results.split("## Replay throughput", 1)[1].split("## Parsing", 1)[0]
    for table in (concurrency, replay):
        # The tables with a "correct" column (concurrency also has a summary table of ratios).
        blocks = [
            b for b in table.split("\n\n") if b.startswith("| ") and b.splitlines()[0].rstrip(" |").endswith("correct")
        ]
        rows = [line for block in blocks for line in block.splitlines() if line.rstrip().endswith("|")]
        # A data row's first cell is its task count (the targets table's rows start with words).
        data_rows = [r for r in rows if r.split("|")[1].strip().replace(",", "").isdigit() or "snapshot=" in r]
        assert data_rows, table
        assert all(r.rstrip(" |").endswith("all") for r in data_rows), data_rows


def test_trivial_graph_matches_the_real_turn_graph_ports() -> None:
    from omegaconf import OmegaConf

    from benchmarks.common import ROOT
    from benchmarks.turn_fixture import NODE_NAMES

    real = OmegaConf.load(ROOT / "flowllm" / "conf" / "pipeline" / "agent_turn.yaml")
    assert tuple(real.nodes.keys()) == NODE_NAMES
    pipeline = trivial_pipeline()
    assert [n.name for n in pipeline.topological] == list(NODE_NAMES)


def test_plain_loop_and_runners_compute_the_same_state() -> None:
    values = typical_turn()
    pipeline = trivial_pipeline(values)
    ctx = TurnContext(task_id="t", turn=1)
    expected = overhead.plain_loop(pipeline, ctx)(turn_inputs(values))
    for name in ("legacy", "graph", "graph_parallel"):
        state = asyncio.run(make_runner(name).run(pipeline, turn_inputs(values), ctx))
        assert state.keys() == expected.keys()
        assert state["next_messages"] == expected["next_messages"]


def test_stat_and_table_helpers() -> None:
    stat = Stat.of([3.0, 1.0, 2.0])
    assert (stat.median, stat.min, stat.max, stat.runs) == (2.0, 1.0, 3.0, 3)
    assert stat.fmt(1, " ms") == "2.0 ms (1.0-3.0)"
    assert md_table(["a", "b"], [[1, 2]]).splitlines() == ["| a | b |", "| :-- | --: |", "| 1 | 2 |"]
    assert Sizes.quick().in_process and not Sizes.full().in_process


def test_script_entry_points_exist() -> None:
    root = Path(run.__file__).parent
    assert (root / "__main__.py").is_file() and (root / "run.py").is_file()


# ----- the start-up section (benchmarks/startup.py) and --only ---------------------------------------------------
def startup_rows(text: str) -> list[list[str]]:
    section = text.split("## Start-up: CPU per task", 1)[1]
    table = section.split("\n\n")[2]  # heading, intro, then the table
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.splitlines()]


def test_the_startup_section_is_registered_and_written(quick_results: str) -> None:
    assert "## Start-up: CPU per task" in quick_results and "--quick sizes" in quick_results
    assert "| Start-up: CPU per task | CPU per task of the sample, start-up included | < 1 s |" in quick_results


def test_only_writes_the_sections_named(tmp_path: Path) -> None:
    output = tmp_path / "results.md"
    assert run.main(["--quick", "--only", "scale", "--output", str(output)]) == 0
    text = output.read_text(encoding="utf-8")
    assert "## Scaling figures and bisect planning" in text and "--quick sizes" in text
    assert "## Engine overhead per node" not in text and "## Start-up: CPU per task" not in text


def test_the_startup_table_has_its_columns_and_rows(quick_results: str) -> None:
    header, align, *rows = startup_rows(quick_results)
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
