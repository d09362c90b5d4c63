"""The adaptive limit of calls in flight (experiment.max_concurrent=auto): AIMD driven by a fake clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flowllm.config.provider_schema import RateLimitConfig
from flowllm.providers.adaptive.aimd import (
    AdaptiveConcurrency,
    AdaptiveFlight,
    AdaptiveSettings,
    AimdController,
    LimitState,
    MemoryLimit,
    SharedLimitFile,
    parse_auto,
)
from flowllm.providers.limiter import LocalLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def controller(start: float = 4.0, ceiling: int = 64) -> tuple[AimdController, Clock]:
    clock = Clock()
    return AimdController(ceiling, MemoryLimit(LimitState(start)), clock=clock), clock


def answer(aimd: AimdController, clock: Clock, latency_s: float = 1.0) -> None:
    ticket = aimd.admit()
    clock.now += latency_s
    aimd.answered(ticket)


def test_doubles_per_round_trip_until_the_first_cut() -> None:
    aimd, clock = controller(start=2.0)
    for _ in range(2 + 4 + 8):  # three round trips at limits 2, 4 and 8
        answer(aimd, clock)
    assert aimd.limit == 16.0


def test_grows_by_one_per_window_of_good_answers_up_to_the_ceiling() -> None:
    aimd, clock = controller(start=8.0, ceiling=6)
    aimd.overloaded(aimd.admit())  # the first cut (to 4) ends the slow start
    answer(aimd, clock)
    assert aimd.limit == 4.0, "held for three round trips after a cut"
    clock.now += 10.0
    for _ in range(4):  # one window at limit 4
        answer(aimd, clock)
    assert 4.9 < aimd.limit <= 5.0, "about one call more per window"
    for _ in range(100):
        answer(aimd, clock)
    assert aimd.limit == 6.0, "never above the ceiling"


def test_a_429_cuts_once_per_episode_and_each_further_refusal_takes_one_call_off() -> None:
    aimd, _ = controller(start=16.0)
    in_flight = [aimd.admit() for _ in range(4)]  # all sent before the provider said no
    for ticket in in_flight:
        aimd.overloaded(ticket)
    assert aimd.limit == 8.0 - 3, "four 429s of one burst: one cut (to 8), then one call fewer for each other"
    aimd.overloaded(aimd.admit())  # sent after the cut (no round trip known yet): the provider still says no
    assert aimd.limit == 2.5
    for _ in range(10):
        aimd.overloaded(aimd.admit())
    assert aimd.limit == 1.0, "never below one call"


def test_a_429_within_a_round_trip_of_the_cut_belongs_to_its_episode() -> None:
    aimd, clock = controller(start=20.0)
    answer(aimd, clock, latency_s=1.0)  # a round trip of one second (slow start: 21)
    aimd.overloaded(aimd.admit())  # one call served in the last round trip: the deepest cut, to half
    assert aimd.limit == 10.5
    clock.now += 0.5
    aimd.overloaded(aimd.admit())  # the provider's quota has not refilled yet: no second cut, one call off
    assert aimd.limit == 9.5
    clock.now += 2.0
    aimd.overloaded(aimd.admit())  # a round trip later: a new episode
    assert aimd.limit == 4.75


def test_near_the_edge_of_the_last_cut_the_limit_probes_slowly() -> None:
    aimd, clock = controller(start=10.0)
    aimd.overloaded(aimd.admit())  # cut from 10 to 5: the edge is near 10
    clock.now += 10.0
    for _ in range(5):  # a window at 5: one call more
        answer(aimd, clock)
    assert 5.9 < aimd.limit <= 6.0
    aimd.store.save(LimitState(9.5, aimd.store.load().cuts))
    for _ in range(10):  # a window at 9.5 (above 90% of the edge): a quarter of a call more
        answer(aimd, clock)
    assert 9.7 < aimd.limit < 9.9


def test_rising_latency_cuts_the_limit() -> None:
    aimd, clock = controller(start=10.0)
    for _ in range(10):
        answer(aimd, clock, latency_s=1.0)
    grown = aimd.limit
    for _ in range(10):  # the provider starts queueing: answers take five times as long
        answer(aimd, clock, latency_s=5.0)
    assert aimd.limit < grown


def test_the_limit_is_shared_through_a_file(tmp_path: Path) -> None:
    clock = Clock()
    first = AimdController(64, SharedLimitFile(tmp_path / "p.concurrency", LimitState(8.0)), clock=clock)
    second = AimdController(64, SharedLimitFile(tmp_path / "p.concurrency", LimitState(8.0)), clock=clock)
    first.overloaded(first.admit())
    assert second.limit == 4.0, "one worker's cut is every worker's"
    ticket = second.admit()
    second.overloaded(ticket)
    assert first.limit == 2.0


def test_a_flight_admits_its_share_and_wakes_waiters_in_order() -> None:
    async def scenario() -> list[int]:
        aimd, _ = controller(start=3.0)
        flight = AdaptiveFlight(aimd, workers=2)
        first = await flight.acquire()
        flight.release(first, overloaded=False)  # answered (at once: no pacing), the limit grows to 4
        tickets = [await flight.acquire() for _ in range(2)]  # this worker's share of 4: 2 at once
        order: list[int] = []

        async def later(n: int) -> None:
            await flight.acquire()
            order.append(n)

        waiting = [asyncio.create_task(later(n)) for n in range(3)]
        await asyncio.sleep(0)
        assert flight.in_flight == 2 and not order
        flight.release(tickets[0], overloaded=None)
        await asyncio.sleep(0)
        flight.release(tickets[1], overloaded=None)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        for task in waiting:
            task.cancel()
        return order

    assert asyncio.run(scenario()) == [0, 1]


def test_until_a_first_answer_one_call_goes_alone() -> None:
    """A start far above the provider's quota sends one call, not a burst the quota refuses whole; its answer
    gives the round trip the next calls are paced by."""

    async def scenario() -> tuple[int, int]:
        aimd, _ = controller(start=64.0)
        flight = AdaptiveFlight(aimd)
        first = await flight.acquire()
        second = asyncio.create_task(flight.acquire())
        await asyncio.sleep(0)
        alone = flight.in_flight
        flight.release(first, overloaded=False)
        await second
        for _ in range(10):  # answered: the limit (65) holds them all at once
            await flight.acquire()
        return alone, flight.in_flight

    assert asyncio.run(scenario()) == (1, 11)


def test_a_retry_waits_before_the_first_tries_already_waiting() -> None:
    """A call the provider refused goes first when it is sent again: behind the first tries it could meet the
    refusal again each time, until it ran out of attempts (a task failed on 429s while the others ran)."""

    async def scenario() -> list[str]:
        aimd, _ = controller(start=1.0)
        aimd.recent_s = 0.0  # a call was answered (at once: no pacing)
        flight = AdaptiveFlight(aimd)
        held = await flight.acquire()
        order: list[str] = []

        async def later(name: str, retry: bool) -> None:
            ticket = await flight.acquire(retry=retry)
            order.append(name)
            flight.release(ticket, overloaded=None)

        waiting = [asyncio.create_task(later("first a", False)), asyncio.create_task(later("first b", False))]
        await asyncio.sleep(0)
        waiting.append(asyncio.create_task(later("retry", True)))
        await asyncio.sleep(0)
        flight.release(held, overloaded=None)
        await asyncio.gather(*waiting)
        return order

    assert asyncio.run(scenario()) == ["retry", "first a", "first b"]


def test_auto_and_its_ceiling_are_read_from_the_setting() -> None:
    assert parse_auto("auto") == 64 and parse_auto("auto:12") == 12 and parse_auto(8) is None
    with pytest.raises(ValueError, match="auto:N"):
        parse_auto("auto:lots")
    limits = AdaptiveConcurrency(AdaptiveSettings(ceiling=12, start=3))
    limits.flight("emu", "model")
    assert limits.describe() == "auto 3/12"


def test_a_429_cuts_to_just_below_what_the_provider_served_in_the_last_round_trip() -> None:
    clock = Clock()
    aimd = AimdController(64, MemoryLimit(LimitState(30.0, cuts=1)), clock=clock)
    sent = [aimd.admit() for _ in range(20)]
    clock.now = 1.0
    for ticket in sent:  # the provider served 20 calls at once, in one round trip of a second
        aimd.answered(ticket)
    aimd.overloaded(aimd.admit())
    assert aimd.limit == pytest.approx(0.85 * 20)


def test_the_callers_a_429_held_leave_one_per_retry_after() -> None:
    """Not all at once: the retry-after frees one request, so the others would meet 429s again."""
    clock = Clock()

    async def sleep(seconds: float) -> None:
        until = clock.now + seconds
        await asyncio.sleep(0)
        clock.now = max(clock.now, until)

    async def scenario() -> list[float]:
        limiter = LocalLimiter(RateLimitConfig(requests_per_minute=6000), clock=clock, sleep=sleep)
        limiter.back_off(1.0)
        passed: list[float] = []

        async def caller() -> None:
            limiter.leave(await limiter.enter())
            passed.append(clock.now)

        await asyncio.gather(*(caller() for _ in range(3)))
        return passed

    assert asyncio.run(scenario()) == [1.0, 2.0, 3.0]
