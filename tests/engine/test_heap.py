"""The run's collector settings: applied inside the block, undone after it (also when the block raises)."""

from __future__ import annotations

import gc
import weakref

import pytest

from flowllm.engine.heap import FULL_COLLECTION_SPACING, MIDDLE_COLLECTION_SPACING, run_collector


def test_the_start_up_heap_is_frozen_and_older_collections_spaced_only_inside_the_block() -> None:
    before = gc.get_threshold()
    with run_collector():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (
            before[0],
            before[1] * MIDDLE_COLLECTION_SPACING,
            before[2] * FULL_COLLECTION_SPACING,
        )
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_settings_are_undone_when_the_block_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), run_collector():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_young_garbage_cycles_are_still_collected_inside_the_block() -> None:
    class Node:
        other: object = None

    with run_collector():
        a, b = Node(), Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
        gc.collect(0)
        assert ref() is None
