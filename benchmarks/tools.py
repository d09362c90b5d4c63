"""Measure the tool layer: server start and stop, per-call overhead, parallel against serial calls.

    python -m benchmarks.tools [--calls 50]

Runs the three built-in servers on a throw-away folder and prints one line per figure. Timings depend on the
machine's load; the parallel figure is the one the engine's ``graph_parallel`` runner relies on (three one-
second tool calls should take about one second together, and about three one after another).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from flowllm.tools.client.pool import ToolPool, open_tool_pool

CONFIG = {
    "name": "benchmark",
    "servers": {
        "tool-python": {"command": "python", "args": ["-m", "flowllm.tools.python", "--timeout-s", "30"]},
        "tool-files": {"command": "python", "args": ["-m", "flowllm.tools.files"]},
        "tool-math": {"command": "python", "args": ["-m", "flowllm.tools.math"]},
    },
}
SLEEP_CODE = "import time\ntime.sleep(1)\nprint('done')"


async def _timed_calls(pool: ToolPool, server: str, tool: str, arguments: dict, n: int) -> list[float]:
    times = []
    for i in range(n):
        start = time.perf_counter()
        result = await pool.call(server, tool, arguments, call_id=str(i), timeout_s=60)
        times.append(time.perf_counter() - start)
        assert not result.is_error, result.content
    return times


async def _sleep_call(pool: ToolPool, call_id: str) -> None:
    result = await pool.call("tool-python", "run_python", {"code": SLEEP_CODE}, call_id=call_id, timeout_s=60)
    assert result.content == "done", result.content


async def run(calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-") as folder:
        start = time.perf_counter()
        async with open_tool_pool(CONFIG, Path(folder)) as pool:
            opened = time.perf_counter() - start
            expression = {"expression": "2**64 / 3"}
            math_times = await _timed_calls(pool, "tool-math", "calculate", expression, calls)
            files_times = await _timed_calls(pool, "tool-files", "list_files", {}, calls)
            python_times = await _timed_calls(pool, "tool-python", "run_python", {"code": "print(1)"}, 10)

            start = time.perf_counter()
            await asyncio.gather(*(_sleep_call(pool, f"p{i}") for i in range(3)))
            parallel = time.perf_counter() - start
            start = time.perf_counter()
            for i in range(3):
                await _sleep_call(pool, f"s{i}")
            serial = time.perf_counter() - start
            closing = time.perf_counter()
        closed = time.perf_counter() - closing

    def ms(values: list[float]) -> str:
        return f"median {statistics.median(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms"

    print(f"open 3 servers (concurrently): {opened:.2f} s")
    print(f"calculate round trip ({calls} calls): {ms(math_times)}")
    print(f"list_files round trip ({calls} calls): {ms(files_times)}")
    print(f"run_python print(1) (10 calls, new interpreter each): {ms(python_times)}")
    print(f"3 x run_python sleep(1), concurrently: {parallel:.2f} s")
    print(f"3 x run_python sleep(1), one after another: {serial:.2f} s")
    print(f"close 3 servers: {closed:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools", description=__doc__)
    parser.add_argument("--calls", type=int, default=50, help="round trips measured per tool")
    asyncio.run(run(parser.parse_args().calls))


if __name__ == "__main__":
    main()
