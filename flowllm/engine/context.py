"""What a node receives besides its inputs: the turn's identity, its services, and the runner's fan-out."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from flowllm.core.interfaces import CallContext, Provider, ToolBackend
from flowllm.core.timeouts import FANOUT_TIMEOUT_S, ITEM_TIMEOUT_S

T = TypeVar("T")
R = TypeVar("R")


class ItemTimeout(TimeoutError):
    """A fan-out item did not finish within its own timeout or the turn's."""


@dataclass
class FanOut:
    """How a runner executes the items of a fan-out node (e.g. one tool call each).

    ``concurrent=False`` runs items one after another (legacy, graph); ``True`` runs them together (graph_parallel).
    Either way every item gets ``item_timeout_s`` and all of them together ``total_timeout_s``; a failed or
    timed-out item becomes an exception in its slot and never loses the others' results.
    """

    concurrent: bool = False
    item_timeout_s: float = ITEM_TIMEOUT_S
    total_timeout_s: float = FANOUT_TIMEOUT_S

    async def map(
        self, fn: Callable[[T], Awaitable[R]], items: Sequence[T], *, item_timeout_s: float | None = None
    ) -> list[R | BaseException]:
        per_item = self.item_timeout_s if item_timeout_s is None else min(item_timeout_s, self.item_timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.total_timeout_s

        async def one(item: T) -> R | BaseException:
            remaining = deadline - loop.time()
            limit = min(per_item, remaining)
            if limit <= 0:
                return ItemTimeout(f"not started: the turn's time limit of {self.total_timeout_s:g}s ran out")
            try:
                async with asyncio.timeout(limit):  # in this task: no task per item just to time it
                    return await fn(item)
            except TimeoutError:
                which = "its" if limit == per_item else "the turn's remaining"
                return ItemTimeout(f"timed out after {limit:g}s ({which} limit)")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed item is a result, not the end of the turn
                return exc

        if not self.concurrent or len(items) < 2:  # a single item has nothing to overlap with: no task for it
            return [await one(item) for item in items]
        return list(await asyncio.gather(*(one(item) for item in items)))


@dataclass
class TurnContext:
    """The services and identity of one turn, handed to every node's ``run``."""

    task_id: str
    turn: int
    provider: Provider | None = None
    tools: ToolBackend | None = None
    fanout: FanOut = field(default_factory=FanOut)
    agent: str = "main"
    scope: str = ""  # see CallContext.scope

    def with_fanout(self, fanout: FanOut) -> TurnContext:
        """This context with the runner's fan-out (``dataclasses.replace`` without its per-field checks: every
        turn of every runner makes one)."""
        twin = object.__new__(TurnContext)
        twin.__dict__.update(self.__dict__)
        twin.fanout = fanout
        return twin

    @property
    def call_context(self) -> CallContext:
        return CallContext(task_id=self.task_id, turn=self.turn, agent=self.agent, scope=self.scope)

    async def map(
        self, fn: Callable[[T], Awaitable[R]], items: Sequence[T], *, item_timeout_s: float | None = None
    ) -> list[R | BaseException]:
        return await self.fanout.map(fn, items, item_timeout_s=item_timeout_s)
