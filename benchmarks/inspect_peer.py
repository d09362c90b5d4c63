"""The peer of the concurrency benchmark: Inspect AI running the same tasks against the same emulator.

N samples at once (``max_samples`` and ``max_connections`` = N), each the same 5-turn task as flowllm's run: a
calculator tool, ``generate(tool_calls="loop")`` until the model answers, scored with ``includes()``. The model is
Inspect's OpenAI-compatible provider (``openai-api/emulator/flowllm-emulator`` with the emulator's ``/v1`` as
its base URL), so the calls go through Inspect's model layer and the official OpenAI SDK to the emulator's Chat
Completions endpoint, 100 ms late like every other call of the benchmark. The emulator's script answers these
requests (sent with ``X-Flowllm-Task: inspect``, Inspect's ``extra_headers``) with native tool calls; flowllm's
run gets the same calls written in its text protocol.

The wall time is the span from the first sample's start to the last sample's end, measured inside the samples
(Inspect's start-up, task loading and log writing are not counted, as flowllm's is not); the CPU is the process's
over the same span. Inspect writes its usual eval log into a scratch folder (``log_samples`` off, no realtime
log, no display).

    python -m benchmarks.inspect_peer --tasks 500 --turns 5 --base-url http://127.0.0.1:PORT --answer 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/inspect_peer.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import peak_rss_mb
from benchmarks.floor import MODEL, QUESTION, calculate

TASK_HEADER = "inspect"  # the emulator script's task key for Inspect's requests (native tool calls)
TOOL_NAME = "calculate"


def native_script(turns: int) -> list[dict[str, Any]]:
    """The emulator's replies for Inspect: ``turns - 1`` native calls of ``calculate``, then the answer."""
    replies: list[dict[str, Any]] = [
        {
            "text": f"Step {t}: let me compute.",
            "tool_calls": [{"name": TOOL_NAME, "input": {"expression": f"2**{t} + {t}"}}],
        }
        for t in range(1, turns)
    ]
    replies.append({"text": "The result is ${last_tool_result}.\n\n\\boxed{${last_tool_result}}"})
    return replies


def run_inspect(tasks: int, turns: int, base_url: str, answer: str) -> dict[str, Any]:
    os.environ.setdefault("INSPECT_DISPLAY", "none")
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import get_model
    from inspect_ai.scorer import includes
    from inspect_ai.solver import Generate, TaskState, generate, solver, use_tools
    from inspect_ai.tool import tool

    @tool(name=TOOL_NAME)
    def calculator() -> Any:
        async def execute(expression: str) -> str:
            """Evaluate an arithmetic expression.

            Args:
                expression: The expression to evaluate.
            """
            return calculate(expression)

        return execute

    span: dict[str, float] = {}
    turns_done: list[int] = []

    @solver
    def timed() -> Any:
        loop = generate(tool_calls="loop")

        async def solve(state: TaskState, gen: Generate) -> TaskState:
            if "t0" not in span:
                span["t0"], span["cpu0"] = time.perf_counter(), time.process_time()
            state = await loop(state, gen)
            turns_done.append(sum(m.role == "assistant" for m in state.messages))
            span["t1"], span["cpu1"] = time.perf_counter(), time.process_time()
            return state

        return solve

    dataset = [Sample(id=i, input=QUESTION, target=answer) for i in range(tasks)]
    task = Task(dataset=dataset, solver=[use_tools(calculator()), timed()], scorer=includes())
    model = get_model(
        f"openai-api/emulator/{MODEL}",
        base_url=base_url.rstrip("/") + "/v1",
        api_key="inspect",
    )
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-inspect-") as logs:
        [log] = eval(
            task,
            model=model,
            max_samples=tasks,
            max_connections=tasks,
            max_tasks=1,
            max_retries=0,
            extra_headers={"X-Flowllm-Task": TASK_HEADER},
            log_dir=logs,
            log_samples=False,
            log_realtime=False,
            display="none",
            score_display=False,
            fail_on_error=False,
        )
    correct = 0
    if log.results is not None and log.results.scores:
        accuracy = log.results.scores[0].metrics.get("accuracy")
        correct = round(accuracy.value * tasks) if accuracy is not None else 0
    errors = [str(log.error.message)[:200]] if log.error is not None else []
    return {
        "tasks": tasks,
        "wall_s": span.get("t1", 0.0) - span.get("t0", 0.0),
        "completed": log.results.completed_samples if log.results is not None else 0,
        "correct": correct,
        "turns": sum(turns_done),
        "errors": errors,
        "cpu_s": span.get("cpu1", 0.0) - span.get("cpu0", 0.0),
        "rss_peak_mb": peak_rss_mb(),
        "status": log.status,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--base-url", required=True, help="the emulator's address")
    parser.add_argument("--answer", required=True, help="the expected final answer")
    args = parser.parse_args(argv)
    print(json.dumps(run_inspect(args.tasks, args.turns, args.base_url, args.answer)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
