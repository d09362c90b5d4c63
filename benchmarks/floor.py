"""The floor of the concurrency benchmark: the same model calls made by a minimal asyncio script, no flowllm.

N tasks at once, each ``turns`` calls of the official Anthropic SDK's ``messages.create`` against the emulator
(the same server, script and latency flowllm's run uses): the reply's calculator call is answered by a few lines
of Python and sent back as a ``<tool_result>`` block, the last reply is checked for the expected
``\\boxed{...}``. Nothing here imports flowllm: what this costs is what the SDK itself costs, the bar flowllm's
engine, parser, agent loop and provider layer are measured above.

The tasks are spread over the same number of SDK clients as flowllm's provider uses (CLIENT_SHARDS in
``flowllm/providers/factory.py``, repeated below so this script stays flowllm-free), so both sides see connection
pools of the same size.

    python -m benchmarks.floor --tasks 500 --turns 5 --base-url http://127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import operator
import re
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/floor.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import CpuClock, GcClock, peak_rss_mb

CLIENTS = 16  # flowllm's CLIENT_SHARDS
MODEL = "flowllm-emulator"
QUESTION = "Compute the value."
# About the size of the system prompt flowllm sends in this workload (its tool-use rules and tool list).
SYSTEM = (
    "You are a careful assistant that solves tasks step by step with the tools you are given. When you know the "
    "answer, put it inside \\boxed{}.\n\nTo call a tool, write a <use_mcp_tool> block with <server_name>, "
    "<tool_name> and <arguments> (one JSON object). Each result comes back in a <tool_result> block.\n\n"
    "## Server: tool-math\n### Tool: calculate\nEvaluate an arithmetic expression.\n"
    'Input JSON schema: {"properties": {"expression": {"type": "string"}}, "required": ["expression"]}\n'
) * 3
_ARGUMENTS = re.compile(r"<arguments>\s*(\{.*?\})\s*</arguments>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^}]*)\}")
_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Pow: operator.pow,
    ast.FloorDiv: operator.floordiv,
}


def calculate(expression: str) -> str:
    """Integer arithmetic (+ - * ** //): the calculator tool of this workload, in a few lines."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return int(_OPS[type(node.op)](walk(node.left), walk(node.right)))
        raise ValueError(f"unsupported expression: {expression!r}")

    return str(walk(ast.parse(expression, mode="eval").body))


async def one_task(client: Any, turns: int, answer: str) -> tuple[bool, int]:
    """One task: ``turns`` calls, each reply's calculator call answered; (right answer, calls made)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    text = ""
    calls = 0
    for _ in range(turns):
        reply = await client.messages.create(model=MODEL, max_tokens=4096, system=SYSTEM, messages=messages)
        calls += 1
        text = "".join(block.text for block in reply.content if block.type == "text")
        found = _ARGUMENTS.search(text)
        if found is None:  # no tool call: this is the answer
            break
        result = calculate(json.loads(found.group(1))["expression"])
        messages.append({"role": "assistant", "content": text})
        messages.append(
            {"role": "user", "content": f'<tool_result server="tool-math" tool="calculate">\n{result}\n</tool_result>'}
        )
    boxed = _BOXED.search(text)
    return boxed is not None and boxed.group(1).strip() == answer, calls


async def run_floor(tasks: int, turns: int, base_url: str, answer: str, clients: int = CLIENTS) -> dict[str, Any]:
    """``tasks`` at once through ``clients`` SDK clients; the wall time and CPU cover the tasks only."""
    import anthropic

    def client() -> Any:
        return anthropic.AsyncAnthropic(base_url=base_url, api_key="floor", max_retries=0, timeout=300)

    # One untimed call through a client of its own: the SDK's one-time set-up (lazy imports, building the reply
    # models) is not part of the floor, as flowllm's provider is built before its clock starts. The timed
    # clients' connections are not warmed by it.
    async with client() as warm:
        await warm.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": QUESTION}])
    pool = [client() for _ in range(min(clients, tasks))]
    try:
        with GcClock() as collector, CpuClock() as cpu:
            t0 = time.perf_counter()
            outcomes = await asyncio.gather(
                *(one_task(pool[i % len(pool)], turns, answer) for i in range(tasks)), return_exceptions=True
            )
            wall = time.perf_counter() - t0
    finally:
        for made in pool:
            await made.close()
    done = [o for o in outcomes if isinstance(o, tuple)]
    errors = sorted({f"{type(o).__name__}: {o}"[:200] for o in outcomes if isinstance(o, BaseException)})[:3]
    return {
        "tasks": tasks,
        "wall_s": wall,
        "completed": len(done),
        "correct": sum(ok for ok, _ in done),
        "turns": sum(calls for _, calls in done),
        "errors": errors,
        "cpu_s": cpu.cpu_s,
        "user_s": cpu.user_s,
        "sys_s": cpu.sys_s,
        "gc_s": collector.seconds,
        "rss_peak_mb": peak_rss_mb(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--base-url", required=True, help="the emulator's address")
    parser.add_argument("--answer", required=True, help="the expected final answer")
    parser.add_argument("--clients", type=int, default=CLIENTS)
    args = parser.parse_args(argv)
    figures = asyncio.run(run_floor(args.tasks, args.turns, args.base_url, args.answer, args.clients))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
