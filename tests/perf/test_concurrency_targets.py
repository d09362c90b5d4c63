"""The concurrency benchmark judges its targets on every repetition, not on a ratio of medians (issue 47)."""

from __future__ import annotations

from typing import Any

from benchmarks.common import Sizes
from benchmarks.concurrency import section

TASKS = 500


def run(wall_s: float, cpu_ms_per_turn: float) -> dict[str, Any]:
    turns = TASKS * 5
    return {
        "tasks": TASKS,
        "wall_s": wall_s,
        "cpu_s": cpu_ms_per_turn * turns / 1000,
        "turns": turns,
        "completed": TASKS,
        "correct": TASKS,
        "errors": [],
        "rss_peak_mb": 200.0,
    }


def results(flowllm: list[tuple[float, float]], floor: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        "levels": {TASKS: [run(*r) for r in flowllm]},
        "workers": {TASKS: [run(w / 1.8, c) for w, c in flowllm]},
        "floor": {TASKS: [run(*r) for r in floor]},
        "inspect": {TASKS: [run(w * 6, c * 6) for w, c in flowllm]},
        "inspect_error": None,
    }


def verdicts(data: dict[str, Any]) -> dict[str, tuple[str, bool | None]]:
    found = section(data, Sizes.full()).targets
    return {t.what.split(" at ")[0]: (t.measured, t.met) for t in found}


def test_a_target_is_met_only_when_every_repetition_meets_it() -> None:
    # Repetition by repetition: 1.18x, 1.20x and 1.32x. The median is inside the target, the range is not.
    data = results([(5.0, 2.0), (5.1, 2.1), (5.0, 1.9)], [(4.3, 1.7), (4.4, 1.75), (3.8, 1.44)])
    cpu, met = verdicts(data)["flowllm's CPU per turn over the floor's per call"]
    assert (cpu, met) == ("1.20x (1.18-1.32)", False)


def test_every_repetition_inside_the_target_meets_it() -> None:
    data = results([(5.0, 2.0), (5.1, 2.1), (5.0, 1.9)], [(4.5, 1.8), (4.6, 1.85), (4.4, 1.75)])
    found = verdicts(data)
    assert found["flowllm's CPU per turn over the floor's per call"][1] is True
    assert found["flowllm's wall / ideal over the floor's"][1] is True
    assert found["2 workers against 1"] == ("1.80x (1.80-1.80)", True)


def test_the_summary_table_states_the_targets_figure() -> None:
    # Repetition by repetition 1.11x, 1.27x and 1.28x (median 1.27x); a ratio of medians would say 5.1 / 4.5 = 1.13x.
    data = results([(5.0, 2.0), (5.1, 2.1), (5.9, 1.9)], [(4.5, 1.8), (4.0, 1.85), (4.6, 1.75)])
    done = section(data, Sizes.full())
    measured = next(t.measured for t in done.targets if t.what.startswith("flowllm's wall / ideal"))
    median = measured.split(" ")[0]
    summary = done.tables[1].splitlines()[2]  # the one level's row
    assert median == "1.27x" and summary.split("|")[2].strip() == median
