"""The cyclic garbage collector's settings while a run lasts: the start-up heap frozen, older collections rarer.

CPython's cyclic collector walks every tracked object on each full (oldest-generation) collection. When a run
starts, the heap already holds hundreds of thousands of long-lived objects (modules, config, the SDK's classes),
and a run of hundreds of concurrent tasks, whose suspended coroutine stacks are themselves a large live set, made
a full collection every few hundred turns: at 500 concurrent tasks that was about a third of the CPU a turn cost
(benchmarks/profile.py). For the run, ``gc.freeze`` moves what exists at its start into the permanent generation,
which collections skip, and full collections wait for ten times as many younger ones as by default.

The middle generation is collected ten times less often too. A task's objects live as long as its model call
(a tenth of a second and more), so nearly all of them survive the youngest generation's collection and are
scanned again by each middle collection until they die or move on: at 500 tasks at once, 40 middle collections
took 0.21-0.25 s of a run's 5.2-5.9 s of CPU, and with ten times fewer, 4 took 0.09-0.15 s (benchmarks/
concurrency.py's workload, 2,500 turns). The youngest generation is collected as by default, so garbage cycles
made in a turn are still freed soon. None of this changes a result, only when and what a collection scans. It is
undone when the run ends, so a process that runs several experiments (tests, sweeps) collects their garbage
later on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

FULL_COLLECTION_SPACING = 10  # the oldest generation's threshold is multiplied by this during a run
MIDDLE_COLLECTION_SPACING = 10  # and the middle generation's by this


@contextmanager
def run_collector() -> Iterator[None]:
    """For the duration of the block: full collections skip every object that exists when it starts, and come
    ``FULL_COLLECTION_SPACING`` times less often; middle ones ``MIDDLE_COLLECTION_SPACING`` times less often."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle * MIDDLE_COLLECTION_SPACING, old * FULL_COLLECTION_SPACING)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(young, middle, old)
