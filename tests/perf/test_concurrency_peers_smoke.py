"""The floor and the peer of the concurrency benchmark run at tiny sizes against the emulator.

Smoke only: the floor (bare Anthropic SDK calls, no flowllm) and Inspect AI (skipped when it is not installed)
finish every task with the right answer and count their calls; the section renders their rows, and a peer that
could not run is reported as not measured instead of vanishing. No timing is asserted.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks import concurrency
from benchmarks.common import Sizes, python, subprocess_env, version_of
from benchmarks.stack import multi_turn_answer
from flowllm.emulator import Emulator

TURNS = 3


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    sizes = Sizes.quick()
    script = concurrency.emulator_script(
        Sizes(**{**sizes.__dict__, "concurrency_turns": TURNS, "latency_s": 0.0})  # the same script, 3 turns
    )
    emu = Emulator(script)
    emu.start()
    try:
        yield emu
    finally:
        emu.stop()


def _run(module: str, emu: Emulator, tasks: int) -> dict[str, Any]:
    cmd = [python(), "-m", module, "--tasks", str(tasks), "--turns", str(TURNS), "--base-url", emu.base_url]
    cmd += ["--answer", multi_turn_answer(TURNS)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_floor_makes_every_call_and_imports_no_flowllm(emulator: Emulator) -> None:
    figures = _run("benchmarks.floor", emulator, 3)
    assert (figures["completed"], figures["correct"], figures["turns"]) == (3, 3, 3 * TURNS), figures
    assert figures["wall_s"] > 0 and figures["cpu_s"] > 0 and figures["rss_peak_mb"] > 0
    code = "import sys, benchmarks.floor; print(sorted(m for m in sys.modules if m.split('.')[0] == 'flowllm'))"
    out = subprocess.run([python(), "-c", code], capture_output=True, text=True, env=subprocess_env(), check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_floor_calculator() -> None:
    from benchmarks.floor import calculate

    assert calculate("2**4 + 4") == "20"
    with pytest.raises(ValueError):
        calculate("__import__('os')")


@pytest.mark.skipif(version_of("inspect-ai") is None, reason="inspect-ai is not installed (pip install -e '.[bench]')")
def test_inspect_ai_runs_the_same_tasks(emulator: Emulator) -> None:
    figures = _run("benchmarks.inspect_peer", emulator, 2)
    assert figures["status"] == "success", figures
    assert (figures["completed"], figures["correct"], figures["turns"]) == (2, 2, 2 * TURNS), figures


def _figures(tasks: int, wall: float) -> dict[str, Any]:
    return {
        "tasks": tasks,
        "wall_s": wall,
        "completed": tasks,
        "correct": tasks,
        "turns": tasks * 5,
        "errors": [],
        "cpu_s": wall / 2,
        "rss_peak_mb": 100.0 + tasks / 10,
    }


def _results(levels: tuple[int, ...], inspect: bool) -> dict[str, Any]:
    return {
        "levels": {t: [_figures(t, 1.0)] for t in levels},
        "workers": {t: [_figures(t, 0.5)] for t in levels},
        "floor": {t: [_figures(t, 0.8)] for t in levels},
        "inspect": {t: [_figures(t, 2.0)] for t in levels} if inspect else {t: [] for t in levels},
        "inspect_error": None if inspect else "inspect-ai is not installed",
    }


def test_the_section_has_a_row_per_run_and_judges_the_targets() -> None:
    sizes = Sizes.full()
    section = concurrency.section(_results((1, 500, 2000), inspect=True), sizes)
    text = section.markdown()
    for label in ("flowllm, 1 worker", "flowllm, 2 workers", "floor: bare SDK calls", "Inspect AI"):
        assert sum(f"| {label}" in line for line in text.splitlines()) == 3, label
    verdicts = {t.what: t.met for t in section.targets}
    assert verdicts["flowllm's wall / ideal over the floor's at 500 tasks"] is True  # 1.0 / 0.8 = 1.25x
    assert verdicts["2 workers against 1 at 2000 tasks"] is True  # 2x
    assert verdicts["ahead of Inspect AI at every level (its wall over flowllm's)"] is True
    assert verdicts["peak memory at 2000 tasks"] is True


def test_a_peer_that_did_not_run_is_not_measured_not_dropped() -> None:
    section = concurrency.section(_results((1, 3), inspect=False), Sizes.quick())
    text = section.markdown()
    assert "Inspect AI: not measured" in text and "inspect-ai is not installed" in text
    verdicts = {t.what: t.met for t in section.targets}
    assert verdicts["ahead of Inspect AI at every level (its wall over flowllm's)"] is None


def test_the_section_splits_cpu_into_user_and_system_and_prices_the_run_folder() -> None:
    """What flowllm's system time per turn is made of, from measured figures: its runs' records per task and what
    a file cost on the section's disk; the floor writes none."""
    results = _results((1, 500), inspect=False)
    for key, user, system in (("levels", 6.0, 2.5), ("floor", 5.0, 0.5)):  # seconds over 500 x 5 turns
        results[key][500][0].update(user_s=user, sys_s=system)
    results["levels"][500][0]["entries_per_task"] = 3.0
    results["file_us"] = [150.0, 420.0]
    text = concurrency.section(results, Sizes.full()).markdown()
    assert "flowllm 2.40 (2.40-2.40) + 1.00 (1.00-1.00) ms, the floor 2.00 (2.00-2.00) + 0.20 (0.20-0.20)" in text
    assert "system time is 0.80 ms per turn above the floor's" in text
    assert "3 folders and files per task" in text and "150 to 420 us of kernel CPU per file" in text
    assert "come to 0.09 to 0.25 ms per turn" in text  # 3 x 150 us / 5 turns, 3 x 420 us / 5
    # Runs measured before the split existed render without it.
    assert "user + system" not in concurrency.section(_results((1, 500), inspect=False), Sizes.full()).markdown()
