"""Small real nodes used by the engine tests (importable by ``_target_``)."""

from __future__ import annotations

import asyncio
from types import MappingProxyType
from typing import Any

from flowllm.engine import Node, TurnContext


class Add(Node):
    outputs = ("total",)

    def __init__(self, amount: int = 1) -> None:
        self.amount = amount

    def run(self, ctx: TurnContext, value: int) -> dict[str, Any]:
        return {"total": value + self.amount}


class TypedAdd(Add):
    """Add, with its output's type declared for the caller's contract."""

    output_types = MappingProxyType({"total": int})


class Double(Node):
    outputs = ("doubled",)

    async def run(self, ctx: TurnContext, total: int) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"doubled": total * 2}


class Join(Node):
    outputs = ("joined",)

    def run(self, ctx: TurnContext, left: int, right: int, bonus: int = 0) -> dict[str, Any]:
        return {"joined": [left, right, bonus]}


class Sleepy(Node):
    """Fans out: sleeps for each delay through ctx.map and reports what happened to each item."""

    outputs = ("slept",)

    async def run(self, ctx: TurnContext, delays: list[float]) -> dict[str, Any]:
        async def nap(delay: float) -> float:
            if delay < 0:
                raise ValueError("negative delay")
            await asyncio.sleep(delay)
            return delay

        results = await ctx.map(nap, delays)
        return {"slept": [r if not isinstance(r, BaseException) else type(r).__name__ for r in results]}


class Broken(Node):
    outputs = ("never",)

    def run(self, ctx: TurnContext, value: int) -> dict[str, Any]:
        raise RuntimeError("boom")


class WrongOutputs(Node):
    outputs = ("promised",)

    def run(self, ctx: TurnContext, value: int) -> dict[str, Any]:
        return {"other": 1}


class NoCtx:
    outputs = ("x",)

    def run(self, value: int) -> dict[str, Any]:
        return {"x": value}


class PeakConcurrency(Node):
    """Fans out n items and reports how many were in flight at once."""

    outputs = ("peak",)

    async def run(self, ctx: TurnContext, n: int) -> dict[str, Any]:
        in_flight = 0
        peak = 0

        async def item(_: int) -> None:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1

        await ctx.map(item, list(range(n)))
        return {"peak": peak}
