"""The real flowllm stack for the end-to-end benchmarks: composed config, emulator script, dataset, tools.

Everything a benchmark run needs is written into a scratch folder: a GAIA-format dataset of N identical tasks and
an emulator script whose replies make each task take a fixed number of turns (a tool call per turn, then the
answer), with the emulator's own ``delay`` fault standing in for a model's latency. The run goes through the same
``prepare`` as ``python -m flowllm`` (Hydra config, pipeline, runner, provider checks), the real SDK, the emulator
and the experiment runner. Tools are served in process (``InProcessTools``): the benchmarks measure flowllm,
and hundreds of concurrent MCP server processes would measure process start-up instead (the tool layer has its
own benchmark: ``python -m benchmarks.tools``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from benchmarks.common import ROOT, CpuClock, GcClock
from flowllm.core.forwarding import ToolBackendDefaults
from flowllm.core.types import ToolResult, ToolSpec
from flowllm.tools.calculator import CalculationError, calculate

MATH = ("tool-math", "calculate")
SLEEP = ("tool-sleep", "sleep")


class InProcessTools(ToolBackendDefaults):
    """A ToolBackend served in process: ``tool-math/calculate`` (flowllm's calculator) and ``tool-sleep/sleep``
    (waits ``seconds``, a stand-in for a tool that takes a fixed time)."""

    async def list_tools(self) -> list[ToolSpec]:
        def spec(server: str, name: str, description: str, prop: str, kind: str) -> ToolSpec:
            schema = {"type": "object", "properties": {prop: {"type": kind}}, "required": [prop]}
            return {"server": server, "name": name, "description": description, "input_schema": schema}

        return [
            spec(*MATH, "Evaluate an arithmetic expression.", "expression", "string"),
            spec(*SLEEP, "Wait for the given number of seconds.", "seconds", "number"),
        ]

    async def call(
        self, server: str | None, name: str, arguments: dict[str, Any], *, call_id: str, timeout_s: float
    ) -> ToolResult:
        if (server, name) == MATH:
            try:
                return ToolResult(call_id, server, name, calculate(str(arguments.get("expression", ""))))
            except CalculationError as exc:
                return ToolResult(call_id, server, name, str(exc), is_error=True)
        if (server, name) == SLEEP:
            await asyncio.sleep(float(arguments.get("seconds", 0)))
            return ToolResult(call_id, server, name, "slept")
        return ToolResult(call_id, server, name, f"unknown tool {server}-{name}", is_error=True)

    async def aclose(self) -> None:
        return None


def open_in_process_tools(tools: Any, workspace: Path, **_: Any) -> Any:
    """``Experiment(open_tools=...)``: every task gets an ``InProcessTools``."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[InProcessTools]:
        yield InProcessTools()

    return opened()


def tool_call_text(server: str, name: str, arguments: dict[str, Any]) -> str:
    """A tool call the way the text protocol's models write it (parsed by flowllm like any reply)."""
    return (
        f"<use_mcp_tool>\n<server_name>{server}</server_name>\n<tool_name>{name}</tool_name>\n"
        f"<arguments>\n{json.dumps(arguments)}\n</arguments>\n</use_mcp_tool>"
    )


def multi_turn_script(turns: int, latency_s: float) -> dict[str, Any]:
    """Every task: ``turns - 1`` turns with one calculator call, then the answer (the last result)."""
    replies: list[dict[str, Any]] = [
        {"text": f"Step {t}: let me compute.\n\n" + tool_call_text(*MATH, {"expression": f"2**{t} + {t}"})}
        for t in range(1, turns)
    ]
    replies.append({"text": "The result is ${last_tool_result}.\n\n\\boxed{${last_tool_result}}"})
    return with_latency({"default": replies}, latency_s)


def fanout_script(ks: tuple[int, ...], tool_seconds: float) -> dict[str, Any]:
    """Task ``k<k>``: one reply with k sleep calls of ``tool_seconds`` each, then an answer."""
    tasks = {}
    for k in ks:
        calls = "\n".join(tool_call_text(*SLEEP, {"seconds": tool_seconds}) for _ in range(k))
        tasks[f"k{k}"] = [{"text": f"Running {k} tools.\n\n{calls}"}, {"text": "\\boxed{done}"}]
    return {"default": [{"text": "\\boxed{none}"}], "tasks": tasks}


def with_latency(script: dict[str, Any], latency_s: float) -> dict[str, Any]:
    # The emulator's delay fault at rate 1: every request is answered latency_s late, like a model's latency.
    if latency_s > 0:
        script = {**script, "faults": {"rules": [{"fault": "delay", "delay_s": latency_s}]}}
    return script


def multi_turn_answer(turns: int) -> str:
    last = turns - 1
    return str(2**last + last) if last >= 1 else "${last_tool_result}"


@dataclass(frozen=True)
class Workload:
    """A dataset folder and an emulator script on disk."""

    dataset: Path
    script: Path
    task_ids: tuple[str, ...]


def write_workload(folder: Path, tasks: int, script: dict[str, Any], answer: str | None, prefix: str = "t") -> Workload:
    folder.mkdir(parents=True, exist_ok=True)
    ids = tuple(f"{prefix}{i:05d}" for i in range(tasks))
    rows = [{"task_id": t, "Question": "Compute the value.", "Level": 1, "Final answer": answer} for t in ids]
    dataset = folder / "dataset"
    dataset.mkdir(exist_ok=True)
    (dataset / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    script_path = folder / "script.yaml"
    script_path.write_text(yaml.safe_dump(script, sort_keys=False), encoding="utf-8")
    return Workload(dataset, script_path, ids)


def compose(overrides: list[str]) -> DictConfig:
    """The config ``python -m flowllm <overrides>`` would run with (Hydra's compose API, same conf/ folder)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import flowllm.app  # noqa: F401  (registers the structured configs and resolvers)

    with initialize_config_dir(config_dir=str(ROOT / "flowllm" / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def workload_overrides(work: Workload, *, runner: str, max_concurrent: int, turns: int, snapshot: str) -> list[str]:
    return [
        f"dataset.path={work.dataset}",
        f"provider.emulator_script={work.script}",
        f"runner={runner}",
        f"experiment.max_concurrent={max_concurrent}",
        f"agent.max_turns={turns + 1}",
        f"recorder.snapshot={snapshot}",
        "experiment.resume=false",
        "progress=false",
    ]


@dataclass
class RunFigures:
    wall_s: float
    completed: int
    correct: int
    turns: int
    errors: list[str]
    cpu_s: float  # CPU time of this process (all its threads) while the tasks ran
    gc_s: float = 0.0  # of which the cyclic garbage collector's
    user_s: float = 0.0  # cpu_s in user space
    sys_s: float = 0.0  # and in the kernel (system calls: sockets, the run's files)


async def run_experiment(
    cfg: DictConfig, run_dir: Path, open_tools: Callable[..., Any] = open_in_process_tools
) -> RunFigures:
    """One experiment as ``flowllm.app`` runs it, tools in process; the wall time covers the tasks only (not
    opening the provider and its emulator)."""
    from flowllm.engine import Recorder
    from flowllm.providers import open_provider
    from flowllm.setup.build import build_experiment, prepare

    parts = prepare(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    # A replay of this run reads the provider that produced it from here, as from a `python -m flowllm` run.
    (run_dir / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save({k: v for k, v in cfg.items() if k != "hydra"}, run_dir / ".hydra" / "config.yaml")
    recorder = Recorder(run_dir, snapshot=cfg.recorder.snapshot)
    try:
        async with open_provider(parts.provider_cfg, resolve=parts.providers) as provider:
            experiment = build_experiment(cfg, parts, provider, recorder, open_tools=open_tools)
            with GcClock() as collector, CpuClock() as cpu:
                t0 = time.perf_counter()
                result = await experiment.run(parts.tasks)
                wall = time.perf_counter() - t0
    finally:
        await asyncio.to_thread(recorder.close)
    outcomes = result.outcomes
    return RunFigures(
        wall_s=wall,
        completed=sum(o.status == "completed" for o in outcomes),
        correct=sum(o.correct is True for o in outcomes),
        turns=sum(o.turns for o in outcomes),
        errors=sorted({o.error for o in outcomes if o.error})[:3],
        cpu_s=cpu.cpu_s,
        gc_s=collector.seconds,
        user_s=cpu.user_s,
        sys_s=cpu.sys_s,
    )
