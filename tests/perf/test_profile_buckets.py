"""How ``benchmarks/profile.py`` reads py-spy's samples: which component a stack is charged to, and which samples
count at all (only those of the timed part of a run)."""

from __future__ import annotations

from benchmarks.profile import ASYNCIO, DISPATCH, SDK, component, in_timed_part, parse_raw

LOOP = [("run", "asyncio/runners.py"), ("BaseEventLoop._run_once", "asyncio/base_events.py")]
TASK = [("Experiment.run.<locals>.bounded", "flowllm/experiment/runner.py")]


def test_the_http_stack_of_the_sdk_is_the_sdks_whatever_its_package_is_called() -> None:
    for path in ("httpcore2/_async/connection_pool.py", "httpcore/_async/connection_pool.py", "h11/_util.py"):
        frames = [*LOOP, *TASK, ("BaseProvider._send", "flowllm/providers/base.py"), ("f", path)]
        assert component(frames) == SDK


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
        f"{loop};run_experiment (benchmarks/stack.py);Experiment.run (flowllm/experiment/runner.py) 3\n"
        f"{loop};EpollSelector.select (selectors.py) 4\n"  # the event loop itself, between tasks
        "Experiment.run.<locals>.bounded (flowllm/experiment/runner.py) 2\n"  # a task's own stack
        "CallModel.run (flowllm/nodes/model.py) 6\n"
        "one_task (benchmarks/floor.py) 2\n"
        "Thread._bootstrap (threading.py);WorkspaceRoot.keep (flowllm/experiment/workspaces.py) 9\n"
        "Thread._bootstrap (threading.py);Recorder.close (flowllm/engine/recorder.py) 8\n"  # after the run
    )
    counted = {frames[-1][0]: count for frames, count in parse_raw(raw) if in_timed_part(frames)}
    assert counted == {
        "Experiment.run": 3,
        "EpollSelector.select": 4,
        "Experiment.run.<locals>.bounded": 2,
        "CallModel.run": 6,
        "one_task": 2,
        "WorkspaceRoot.keep": 9,
    }
