"""How ``benchmarks/profile.py`` reads py-spy's samples: which component a stack is charged to, and which samples
count at all (only those of the timed part of a run)."""

from __future__ import annotations

from benchmarks.profile import (
    ASYNCIO,
    DISPATCH,
    NORMALIZE,
    PROVIDER,
    REQUEST,
    SDK,
    component,
    in_timed_part,
    parse_raw,
)

LOOP = [("run", "asyncio/runners.py"), ("BaseEventLoop._run_once", "asyncio/base_events.py")]
TASK = [("Experiment.run.<locals>.bounded", "flowllm/run/runner.py")]


def test_the_http_stack_of_the_sdk_is_the_sdks_whatever_its_package_is_called() -> None:
    for path in ("httpcore2/_async/connection_pool.py", "httpcore/_async/connection_pool.py", "h11/_util.py"):
        frames = [*LOOP, *TASK, ("BaseProvider._send", "flowllm/providers/base.py"), ("f", path)]
        assert component(frames) == SDK


def test_a_protocols_helpers_are_request_building_or_normalisation_by_name() -> None:
    send = [*LOOP, *TASK, ("BaseProvider._send", "flowllm/providers/base.py")]
    assert component(
        [*send, ("AnthropicProvider._message.<locals>.<listcomp>", "flowllm/providers/wire/anthropic.py")]
    ) == (REQUEST)
    assert component([*send, ("_as_content", "flowllm/providers/wire/anthropic.py")]) == REQUEST
    assert component([*send, ("BaseProvider._body", "flowllm/providers/base.py"), ("loads", "json/x.py")]) == NORMALIZE
    assert component([*send, ("AnthropicProvider.read_body", "flowllm/providers/wire/anthropic.py")]) == NORMALIZE
    # The arguments helpers both halves call go to the caller's half.
    shared = ("dump_arguments", "flowllm/providers/base.py")
    assert (
        component([*send, ("AnthropicProvider.read_body", "flowllm/providers/wire/anthropic.py"), shared]) == NORMALIZE
    )
    assert component([*send, ("tool_call_arguments", "flowllm/providers/wire/openai_chat.py"), shared]) == REQUEST
    assert component([*send, ("tool_use_block", "flowllm/providers/wire/openai_chat.py"), shared]) == NORMALIZE
    assert component(send) == PROVIDER
    assert component([*send, ("connection_message", "flowllm/providers/errors.py")]) == PROVIDER


def test_general_purpose_libraries_are_charged_to_their_caller() -> None:
    frames = [*LOOP, *TASK, ("calculate", "flowllm/tools/calculator.py"), ("loads", "json/__init__.py")]
    assert component(frames) == DISPATCH
    assert component([*LOOP, ("Handle._run", "asyncio/events.py")]) == ASYNCIO


def test_only_samples_of_the_timed_part_of_a_run_count() -> None:
    main = "_run_module_as_main (runpy.py);child (benchmarks/concurrency.py)"
    loop = f"{main};run (asyncio/runners.py);BaseEventLoop.run_until_complete (asyncio/base_events.py)"
    raw = (
        f"{main};_find_and_load (<frozen importlib._bootstrap>) 11\n"  # importing, before the run
        f"{main};compose (benchmarks/stack.py) 5\n"
        f"{loop};run_experiment (benchmarks/stack.py);open_provider (flowllm/providers/factory.py) 7\n"
        f"{loop};run_experiment (benchmarks/stack.py);Experiment.run (flowllm/run/runner.py) 3\n"
        f"{loop};EpollSelector.select (selectors.py) 4\n"  # the event loop itself, between tasks
        "Experiment.run.<locals>.bounded (flowllm/run/runner.py) 2\n"  # a task's own stack
        "CallModel.run (flowllm/nodes/model.py) 6\n"
        "one_task (benchmarks/floor.py) 2\n"
        "Thread._bootstrap (threading.py);WorkspaceRoot.keep (flowllm/run/workspaces.py) 9\n"
        "Thread._bootstrap (threading.py);Recorder.close (flowllm/engine/recorder.py) 8\n"  # after the run
        # A callback the event loop ran: its stack starts in asyncio.
        "Handle._run (/usr/lib/python3.11/asyncio/events.py);Normalize.run (flowllm/nodes/model.py) 1\n"
        # Stacks py-spy could not read to their root: composing the config, importing. Not counted.
        "Box._re_parent (omegaconf/base.py) 12\n"
        "_call_with_frames_removed (<frozen importlib._bootstrap>) 13\n"
    )
    counted = {frames[-1][0]: count for frames, count in parse_raw(raw) if in_timed_part(frames)}
    assert counted == {
        "Experiment.run": 3,
        "EpollSelector.select": 4,
        "Experiment.run.<locals>.bounded": 2,
        "CallModel.run": 6,
        "Normalize.run": 1,
        "one_task": 2,
        "WorkspaceRoot.keep": 9,
    }


def test_the_collector_is_a_line_of_its_own_and_the_rest_is_split_by_the_samples() -> None:
    from collections import Counter

    from benchmarks.profile import GC, OTHER, Profile, summary

    # Two runs of 100 turns: 300 ms of CPU, 60 of them in the collector.
    runs = [
        (Counter({SDK: 30, DISPATCH: 10}), {"cpu_s": 0.1, "gc_s": 0.02, "turns": 100}),
        (Counter({SDK: 30, OTHER: 10}), {"cpu_s": 0.2, "gc_s": 0.04, "turns": 100}),
    ]
    live = Profile.of(runs, "cpu_s")
    assert abs(live.cpu_ms_per_unit - 1.5) < 1e-12 and abs(live.gc_ms_per_unit - 0.3) < 1e-12
    assert abs(live.ms(GC) - 0.3) < 1e-12
    assert abs(live.ms(SDK) - 1.2 * 60 / 80) < 1e-12  # the CPU outside the collector, by the samples' share
    assert abs(sum(live.ms(name) for name in (SDK, DISPATCH, OTHER, GC)) - 1.5) < 1e-12
    floor = Profile({SDK: 10}, 1.0, 0.1)
    text = summary({"flowllm": live, "floor": floor, "replay": floor})
    # +0.50 in all: SDK 0.90 - 0.90, collector 0.30 - 0.10, the rest is flowllm's own.
    assert "+0.50 ms" in text and "+0.00 ms is the SDK" in text and "+0.20 ms the garbage collector" in text
    assert "+0.30 ms flowllm's own code" in text


def test_the_gc_clock_times_collections_inside_its_block_only() -> None:
    import gc

    from benchmarks.common import GcClock

    with GcClock() as clock:
        gc.collect()
    inside = clock.seconds
    assert inside > 0
    gc.collect()
    assert clock.seconds == inside and clock._callback not in gc.callbacks
