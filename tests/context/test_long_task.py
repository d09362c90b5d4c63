"""The issue's bar: a 60-turn offline task (real SDK, emulator, MCP tool servers, the whole app) stays under its
token budget and still finishes correctly, with the budget switched on by config alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowllm.app import run
from flowllm.engine.recorder import read_json

DATA = Path(__file__).resolve().parents[1] / "data" / "long_task"
BUDGET = 12000


def test_a_60_turn_task_stays_under_its_budget_and_finishes(tmp_path: Path, compose_cfg: Any) -> None:
    cfg = compose_cfg(
        f"dataset.path={DATA}",
        f"provider.emulator_script={DATA / 'script.yaml'}",
        "agent.max_turns=70",
        f"agent.max_context_tokens={BUDGET}",
        "runner=graph_parallel",
        "progress=false",
    )
    summary = run(cfg, tmp_path)
    assert summary["accuracy"] == 1.0, summary
    task = tmp_path / "tasks" / "long-60-turns"
    result = read_json(task / "result.json")
    assert (result["answer"], result["turns"], result["tool_calls"]) == ("59", 60, 118)

    turns = sorted(task.glob("turn_*"))
    assert len(turns) == 60
    # What the provider counted for every request (the emulator counts like a tokenizer would: per character).
    prompts = [read_json(t / "04_normalize" / "output.json")["response"]["usage"]["input_tokens"] for t in turns]
    assert max(prompts) <= BUDGET
    decisions = [read_json(t / "01_trim_history" / "output.json")["context_budget"] for t in turns]
    last = decisions[-1]
    # The untrimmed history is many times the budget: the budget, not luck, kept the requests small.
    assert last["before"]["tokens"] > 5 * BUDGET and last["after"]["tokens"] <= BUDGET
    assert last["before"]["source"] == "provider_usage" and last["after"]["estimated"] is False
    assert decisions[0]["before"]["estimated"] is True  # turn 1 has no usage yet: an estimate, and it says so
    assert len(last["blanked"]) > 50 and last["dropped_turns"] == 0 and not last["over_budget"]
