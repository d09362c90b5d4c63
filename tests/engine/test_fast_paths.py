"""The fast paths the benchmarks led to in the engine (runners.py, recorder.py) keep the engine's behaviour.

They were written with the benchmark work; they test engine behaviour only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from flowllm.engine import BoundNode, Node, Recorder, TurnContext, build_pipeline, make_runner
from flowllm.engine.errors import NodeExecutionError
from flowllm.engine.recorder import read_json

RUNNERS = ["legacy", "graph", "graph_parallel"]


class CallableReturningCoroutine(Node):
    """A node whose ``run`` is a plain function that returns a coroutine (looks sync, is async)."""

    outputs = ("out",)
    calls: ClassVar[list[int]] = []

    def run(self, ctx: TurnContext, value: int) -> Any:
        self.calls.append(value)

        async def later() -> dict[str, Any]:
            await asyncio.sleep(0)
            return {"out": value * 10}

        return later()


class Renamed(Node):
    outputs = ("total",)

    def run(self, ctx: TurnContext, value: int, bonus: int = 0) -> dict[str, Any]:
        return {"total": value + bonus}


class Collecting:
    def __init__(self, records: bool, reads_meta: bool = True) -> None:
        self.records_nodes = records
        self.reads_meta = reads_meta
        self.seen: list[str] = []
        self.metas: list[dict[str, Any]] = []

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None:
        self.seen.append(node.name)
        self.metas.append(meta)


@pytest.mark.parametrize("runner", RUNNERS)
async def test_a_sync_run_returning_a_coroutine_is_awaited_once(runner: str, tmp_path: Path) -> None:
    CallableReturningCoroutine.calls.clear()
    pipeline = build_pipeline({"c": {"_target_": CallableReturningCoroutine()}}, provided=("value",))
    with Recorder(tmp_path) as rec:
        state = await make_runner(runner).run(pipeline, {"value": 4}, TurnContext("t", 1), rec)
    assert state["out"] == 40
    assert CallableReturningCoroutine.calls == [4]  # never called twice
    assert read_json(tmp_path / "tasks" / "t" / "turn_001" / "01_c" / "output.json") == {"out": 40}


@pytest.mark.parametrize("runner", RUNNERS)
async def test_renamed_ports_and_optional_inputs(runner: str) -> None:
    pipeline = build_pipeline(
        {"r": {"_target_": Renamed(), "inputs": {"value": "start"}, "outputs": {"total": "end"}}},
        provided=("start", "bonus"),
    )
    state = await make_runner(runner).run(pipeline, {"start": 1, "bonus": 2}, TurnContext("t", 1))
    assert state["end"] == 3 and "total" not in state
    without_bonus = await make_runner(runner).run(pipeline, {"start": 1}, TurnContext("t", 1))
    assert without_bonus["end"] == 1


@pytest.mark.parametrize("runner", RUNNERS)
async def test_observers_that_record_nothing_are_not_called(runner: str) -> None:
    pipeline = build_pipeline({"r": {"_target_": Renamed()}}, provided=("value",))
    quiet, loud = Collecting(records=False), Collecting(records=True)
    await make_runner(runner).run(pipeline, {"value": 1}, TurnContext("t", 1), quiet)
    await make_runner(runner).run(pipeline, {"value": 1}, TurnContext("t", 1), loud)
    assert quiet.seen == [] and loud.seen == ["r"]


class Failing(Node):
    outputs = ("total",)

    def run(self, ctx: TurnContext, value: int) -> dict[str, Any]:
        raise ValueError("no")


@pytest.mark.parametrize("runner", RUNNERS)
async def test_an_observer_that_reads_no_meta_gets_an_empty_one(runner: str) -> None:
    pipeline = build_pipeline({"r": {"_target_": Renamed()}}, provided=("value",))
    timed, untimed = Collecting(records=True), Collecting(records=True, reads_meta=False)
    await make_runner(runner).run(pipeline, {"value": 1}, TurnContext("t", 1), timed)
    await make_runner(runner).run(pipeline, {"value": 1}, TurnContext("t", 1), untimed)
    assert timed.metas[0]["status"] == "ok" and timed.metas[0]["runner"] == runner
    assert untimed.seen == ["r"] and untimed.metas == [{}]
    failing = build_pipeline({"f": {"_target_": Failing()}}, provided=("value",))
    with pytest.raises(NodeExecutionError):
        await make_runner(runner).run(failing, {"value": 1}, TurnContext("t", 1), untimed)
    assert untimed.seen == ["r", "f"] and untimed.metas[-1] == {}  # still told of the failure


def test_recorder_keeps_write_order_and_survives_a_removed_folder(tmp_path: Path) -> None:
    import shutil

    rec = Recorder(tmp_path)
    target = tmp_path / "tasks" / "t" / "result.json"
    for i in range(50):
        rec.write_json(target, {"i": i})
    rec.flush()
    assert read_json(target) == {"i": 49}  # one FIFO writer: the last write wins
    shutil.rmtree(tmp_path / "tasks")  # a rerun wipes the task folder the writer already made
    rec.write_json(target, {"i": "again"})
    rec.close()
    assert read_json(target) == {"i": "again"} and rec.write_errors == 0
    with pytest.raises(RuntimeError, match="closed"):
        rec.write_json(target, {})


def test_credential_fields_in_any_case_are_still_masked(tmp_path: Path) -> None:
    with Recorder(tmp_path) as rec:
        rec.write_json(
            tmp_path / "x.json",
            {
                "X-API-KEY": "v1",
                "Proxy-Authorization": "v2",
                "client_Secret": "v3",
                "Secret": "v4",
                "note": "monkey keys",
            },
        )
    data = read_json(tmp_path / "x.json")
    assert data["X-API-KEY"] == data["Proxy-Authorization"] == data["Secret"] == "[redacted]"
    assert data["note"] == "monkey keys"


def test_with_fanout_is_replace() -> None:
    import dataclasses

    from flowllm.engine.context import FanOut

    ctx = TurnContext("t", 3, agent="coder", scope="turn_001/subagents/coder-c1")
    fanout = FanOut(True, 5.0, 50.0)
    assert ctx.with_fanout(fanout) == dataclasses.replace(ctx, fanout=fanout)
    assert ctx.with_fanout(fanout) is not ctx and ctx.fanout == FanOut()  # the original is left as it was
