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
    # One source, two async branches that may overlap, one join: the branches finish in any order.
    "diamond": {
        "source": {"_target_": f"{T}.Add", "amount": 1},
        "slow": {"_target_": f"{T}.Double", "outputs": {"doubled": "left"}},
        "fast": {"_target_": f"{T}.Double", "outputs": {"doubled": "right"}},
        "join": {"_target_": f"{T}.Join"},
    },
    # Fan-out then fan-in through renamed ports on both sides, with an optional input that is produced.
    "fan_out_fan_in": {
        "base": {"_target_": f"{T}.Add", "amount": 0},
        "l": {"_target_": f"{T}.Add", "amount": 5, "inputs": {"value": "total"}, "outputs": {"total": "left"}},
        "r": {"_target_": f"{T}.Add", "amount": 7, "inputs": {"value": "total"}, "outputs": {"total": "right"}},
        "b": {"_target_": f"{T}.Add", "amount": 9, "inputs": {"value": "total"}, "outputs": {"total": "bonus"}},
        "join": {"_target_": f"{T}.Join"},
    },
    # An optional input nobody produces: the node runs with its default.
    "optional_absent": {
        "l": {"_target_": f"{T}.Add", "amount": 1, "outputs": {"total": "left"}},
        "r": {"_target_": f"{T}.Add", "amount": 2, "outputs": {"total": "right"}},
        "join": {"_target_": f"{T}.Join"},
    },
}
EXPECTED = {
    "chain": {"doubled": 12},
    "fan_in": {"joined": [15, 25, 0]},
    "crossed": {"joined": [12, 7, 0]},
    "diamond": {"joined": [12, 12, 0]},
    "fan_out_fan_in": {"joined": [10, 12, 14]},
    "optional_absent": {"joined": [6, 7, 0]},
}


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
async def test_runners_agree_on_state(topology: str) -> None:
    pipeline = build_pipeline(TOPOLOGIES[topology], provided=("value",))
    results = []
    for name in RUNNER_NAMES:
        ctx = TurnContext(task_id="t", turn=1)
        results.append(await make_runner(name).run(pipeline, {"value": 5}, ctx))
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("runner", RUNNER_NAMES)
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
async def test_every_topology_gives_its_values_under_every_runner(topology: str, runner: str) -> None:
    pipeline = build_pipeline(TOPOLOGIES[topology], provided=("value",))
    state = await make_runner(runner).run(pipeline, {"value": 5}, TurnContext("t", 1))
    for key, value in EXPECTED[topology].items():
        assert state[key] == value


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
async def test_every_topology_records_byte_identical_artifacts_under_every_runner(topology: str, tmp_path) -> None:
    pipeline = build_pipeline(TOPOLOGIES[topology], provided=("value",))
    trees = []
    for name in RUNNER_NAMES:
        with Recorder(tmp_path / name) as rec:
            await make_runner(name).run(pipeline, {"value": 5}, TurnContext("task-1", 1), rec)
        turn = tmp_path / name / "tasks" / "task-1" / "turn_001"
        trees.append(
            {
                str(f.relative_to(turn)): f.read_bytes()
                for f in sorted(turn.rglob("*.json"))
                if f.name != "meta.json"  # timings and the runner's name
            }
        )
    assert trees[0] and trees[0] == trees[1] == trees[2]


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
    # Items that return at once against one that would sleep for minutes: the budget is far from both.
    r = make_runner(runner, item_timeout_s=1, fanout_timeout_s=60)
    state = await r.run(pipeline, {"delays": [0, -1, 600, 0]}, TurnContext("t", 1))
    assert state["slept"] == [0, "ValueError", "ItemTimeout", 0]


@pytest.mark.parametrize(("runner", "peak"), [("legacy", 1), ("graph", 1), ("graph_parallel", 4)])
async def test_fanout_overlaps_only_under_graph_parallel(runner: str, peak: int) -> None:
    pipeline = build_pipeline({"p": {"_target_": f"{T}.PeakConcurrency"}}, provided=("n",))
    state = await make_runner(runner).run(pipeline, {"n": 4}, TurnContext("t", 1))
    assert state["peak"] == peak


@pytest.mark.parametrize("runner", RUNNER_NAMES)
async def test_turn_timeout_bounds_all_items_together(runner: str) -> None:
    # Each item alone is within its own budget; together they are not: the turn's budget stops the rest.
    pipeline = build_pipeline({"sleep": {"_target_": f"{T}.Sleepy"}}, provided=("delays",))
    r = make_runner(runner, item_timeout_s=600, fanout_timeout_s=1)
    state = await r.run(pipeline, {"delays": [0, 300, 300]}, TurnContext("t", 1))
    assert state["slept"] == [0, "ItemTimeout", "ItemTimeout"]


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
    task = asyncio.create_task(make_runner("graph_parallel").run(pipeline, {"delays": [5, 5]}, TurnContext("t", 1)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
