"""The cyclic garbage collector's settings while a run lasts: the start-up heap frozen, full collections rarer.

CPython's cyclic collector walks every tracked object on each full (oldest-generation) collection. When a run
starts, the heap already holds hundreds of thousands of long-lived objects (modules, config, the SDK's classes),
and a run of hundreds of concurrent tasks, whose suspended coroutine stacks are themselves a large live set, made
a full collection every few hundred turns: at 500 concurrent tasks that was about a third of the CPU a turn cost
(benchmarks/profile.py). For the run, ``gc.freeze`` moves what exists at its start into the permanent generation,
which collections skip, and full collections wait for ten times as many younger ones as by default; young
garbage is collected as before. Neither changes a result, only when and what a collection scans. Both are undone
when the run ends, so a process that runs several experiments (tests, sweeps) collects their garbage later on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

FULL_COLLECTION_SPACING = 10  # the oldest generation's threshold is multiplied by this during a run


@contextmanager
def run_collector() -> Iterator[None]:
    """For the duration of the block: full collections skip every object that exists when it starts, and come
    ``FULL_COLLECTION_SPACING`` times less often."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old * FULL_COLLECTION_SPACING)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(young, middle, old)
