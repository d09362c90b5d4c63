"""The three runners against shared topologies: same results, same records, different overlap."""

from __future__ import annotations

import asyncio

import pytest

from flowllm.engine import (
    NodeContractError,
    NodeExecutionError,
    Recorder,
    TurnContext,
    build_pipeline,
    make_runner,
)
from flowllm.engine.recorder import read_json

T = "tests.engine.nodes_for_tests"
RUNNER_NAMES = ["legacy", "graph", "graph_parallel"]

TOPOLOGIES = {
    "chain": {"add": {"_target_": f"{T}.Add"}, "double": {"_target_": f"{T}.Double"}},
    "fan_in": {
        "left": {"_target_": f"{T}.Add", "amount": 10, "outputs": {"total": "left"}},
        "right": {"_target_": f"{T}.Add", "amount": 20, "outputs": {"total": "right"}},
        "join": {"_target_": f"{T}.Join"},
    },
    "crossed": {
        "a": {"_target_": f"{T}.Add", "amount": 1},
        "b": {"_target_": f"{T}.Add", "amount": 2, "outputs": {"total": "right"}},
        "double": {"_target_": f"{T}.Double"},
        "join": {"_target_": f"{T}.Join", "inputs": {"left": "doubled"}},
    },
}


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
async def test_runners_agree_on_state(topology: str) -> None:
    pipeline = build_pipeline(TOPOLOGIES[topology], provided=("value",))
    results = []
    for name in RUNNER_NAMES:
        ctx = TurnContext(task_id="t", turn=1)
        results.append(await make_runner(name).run(pipeline, {"value": 5}, ctx))
    assert results[0] == results[1] == results[2]


async def test_crossed_topology_values() -> None:
    pipeline = build_pipeline(TOPOLOGIES["crossed"], provided=("value",))
    state = await make_runner("graph_parallel").run(pipeline, {"value": 5}, TurnContext("t", 1))
    assert state["joined"] == [12, 7, 0]


@pytest.mark.parametrize("runner", RUNNER_NAMES)
async def test_records_are_identical_across_runners(runner: str, tmp_path) -> None:
    pipeline = build_pipeline(TOPOLOGIES["crossed"], provided=("value",))
    with Recorder(tmp_path / runner) as rec:
        await make_runner(runner).run(pipeline, {"value": 5}, TurnContext("task-1", 1), rec)
    turn = tmp_path / runner / "tasks" / "task-1" / "turn_001"
    assert sorted(p.name for p in turn.iterdir()) == ["01_a", "02_b", "03_double", "04_join"]
    assert read_json(turn / "04_join" / "output.json") == {"joined": [12, 7, 0]}
    assert read_json(turn / "04_join" / "input.json") == {"left": 12, "right": 7}
    assert read_json(turn / "01_a" / "meta.json")["runner"] == runner


@pytest.mark.parametrize("runner", RUNNER_NAMES)
async def test_fanout_keeps_results_of_others_when_one_fails_or_times_out(runner: str) -> None:
    pipeline = build_pipeline({"sleep": {"_target_": f"{T}.Sleepy"}}, provided=("delays",))
    r = make_runner(runner, item_timeout_s=0.2, turn_timeout_s=5)
    state = await r.run(pipeline, {"delays": [0.01, -1, 10, 0.02]}, TurnContext("t", 1))
    assert state["slept"] == [0.01, "ValueError", "ItemTimeout", 0.02]


@pytest.mark.parametrize(("runner", "peak"), [("legacy", 1), ("graph", 1), ("graph_parallel", 4)])
async def test_fanout_overlaps_only_under_graph_parallel(runner: str, peak: int) -> None:
    pipeline = build_pipeline({"p": {"_target_": f"{T}.PeakConcurrency"}}, provided=("n",))
    state = await make_runner(runner).run(pipeline, {"n": 4}, TurnContext("t", 1))
    assert state["peak"] == peak


async def test_turn_timeout_bounds_all_items_together() -> None:
    pipeline = build_pipeline({"sleep": {"_target_": f"{T}.Sleepy"}}, provided=("delays",))
    r = make_runner("legacy", item_timeout_s=5, turn_timeout_s=0.15)
    state = await r.run(pipeline, {"delays": [0.1, 0.1, 0.1]}, TurnContext("t", 1))
    assert state["slept"][0] == 0.1
    assert "ItemTimeout" in state["slept"][1:]


@pytest.mark.parametrize("runner", RUNNER_NAMES)
async def test_node_failure_is_recorded_and_raised(runner: str, tmp_path) -> None:
    pipeline = build_pipeline(
        {
            "add": {"_target_": f"{T}.Add"},
            "broken": {"_target_": f"{T}.Broken", "inputs": {"value": "total"}},
        },
        provided=("value",),
    )
    with Recorder(tmp_path) as rec, pytest.raises(NodeExecutionError, match="node 'broken' failed"):
        await make_runner(runner).run(pipeline, {"value": 1}, TurnContext("t", 2), rec)
    folder = tmp_path / "tasks" / "t" / "turn_002" / "02_broken"
    meta = read_json(folder / "meta.json")
    assert meta["status"] == "error" and "RuntimeError: boom" in meta["error"]
    assert "Traceback" in meta["traceback"]
    assert read_json(folder / "input.json") == {"value": 2}
    assert not (folder / "output.json").exists()


async def test_wrong_outputs_break_the_contract() -> None:
    pipeline = build_pipeline({"w": {"_target_": f"{T}.WrongOutputs"}}, provided=("value",))
    with pytest.raises(NodeExecutionError) as err:
        await make_runner("graph").run(pipeline, {"value": 1}, TurnContext("t", 1))
    assert isinstance(err.value.cause, NodeContractError)
    assert "declares outputs ['promised']" in str(err.value)


async def test_cancellation_propagates_through_graph_parallel() -> None:
    pipeline = build_pipeline({"sleep": {"_target_": f"{T}.Sleepy"}}, provided=("delays",))
    task = asyncio.create_task(
        make_runner("graph_parallel").run(pipeline, {"delays": [5, 5]}, TurnContext("t", 1))
    )
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
