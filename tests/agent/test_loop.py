"""The agent loop's stop conditions, through the real pipeline, the real SDK and the emulator."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from flowllm.agent.loop import Agent
from flowllm.agent.results import STOP_MAX_TURNS, STOP_NO_TOOL_CALLS, AgentSettings
from flowllm.config.plain import plain_config
from flowllm.config.provider_schema import ProviderConfig
from flowllm.config.schema import register_configs
from flowllm.core.forwarding import ToolBackendDefaults
from flowllm.core.types import ToolResult, ToolSpec
from flowllm.engine import Recorder, make_runner
from flowllm.engine.pipeline import pipeline_from_config
from flowllm.engine.recorder import read_json
from flowllm.providers import open_provider
from flowllm.resources import CONFIG_DIR

CALL = """<use_mcp_tool>
<server_name>tool-math</server_name>
<tool_name>calculate</tool_name>
<arguments>{"expression": "1+1"}</arguments>
</use_mcp_tool>"""

SCRIPT = {
    "default": [{"text": "out of script \\boxed{none}"}],
    "tasks": {
        "answers-at-once": [{"text": "Easy: \\boxed{4}"}],
        "always-calls": [{"text": CALL}, {"text": CALL}, {"text": CALL}, {"text": "Final: \\boxed{2}"}],
        "bad-then-answer": [
            {"text": "<use_mcp_tool><server_name>tool-math</server_name></use_mcp_tool>"},
            {"text": "Sorry. \\boxed{ok}"},
        ],
    },
}


@pytest.fixture(scope="module")
def pipeline_cfg():
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config")


async def run_task(tmp_path: Path, cfg, task_id: str, max_turns: int = 5):
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump(SCRIPT))
    provider_cfg = ProviderConfig(name="offline", model="flowllm-emulator", emulator_script=str(script))
    pipeline = pipeline_from_config(plain_config(cfg.pipeline))
    with Recorder(tmp_path / "run") as recorder:
        agent = Agent(pipeline, make_runner("graph"), AgentSettings(max_turns=max_turns), observer=recorder)
        async with open_provider(provider_cfg) as provider:
            return await agent.run(task_id, "What is 2+2?", provider, tools=None)


async def test_stops_when_the_model_calls_no_tool(tmp_path: Path, pipeline_cfg) -> None:
    result = await run_task(tmp_path, pipeline_cfg, "answers-at-once")
    assert (result.turns, result.stop, result.answer) == (1, STOP_NO_TOOL_CALLS, "4")
    assert result.usage.output_tokens > 0


async def test_turn_limit_adds_a_summary_turn_without_tools(tmp_path: Path, pipeline_cfg) -> None:
    result = await run_task(tmp_path, pipeline_cfg, "always-calls", max_turns=3)
    assert (result.turns, result.stop, result.answer) == (4, STOP_MAX_TURNS, "2")
    assert result.tool_calls == 3
    # No tool backend was given: each call came back as an error the model can read, and nothing crashed.
    assert result.failed_tool_calls == 3
    out = read_json(tmp_path / "run" / "tasks" / "always-calls" / "turn_004" / "07_dispatch_tools" / "output.json")
    assert out["tool_results"] == []


async def test_an_unreadable_call_is_answered_and_the_loop_goes_on(tmp_path: Path, pipeline_cfg) -> None:
    result = await run_task(tmp_path, pipeline_cfg, "bad-then-answer")
    assert result.bad_tool_calls == 1 and result.turns == 2 and result.answer == "ok"
    out = read_json(tmp_path / "run" / "tasks" / "bad-then-answer" / "turn_001" / "07_dispatch_tools" / "output.json")
    assert out["tool_results"][0]["is_error"] is True
    assert "could not be read" in out["tool_results"][0]["content"]


class OneTool(ToolBackendDefaults):
    """A tool backend with one tool that always answers "2" (the ToolBackend protocol, nothing more)."""

    async def list_tools(self) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"expression": {"type": "string"}}}
        return [{"server": "tool-math", "name": "calculate", "description": "Calculate.", "input_schema": schema}]

    async def call(self, server, name, arguments, *, call_id, timeout_s, state=None) -> ToolResult:
        return ToolResult(call_id=call_id, server=server, name=name, content="2")

    async def aclose(self) -> None:
        return None


async def test_the_summary_turn_offers_no_tools(tmp_path: Path, pipeline_cfg) -> None:
    script = tmp_path / "script.yaml"
    call = {"tool_calls": [{"name": "tool-math-calculate", "input": {"expression": "1+1"}}]}
    script.write_text(yaml.safe_dump({"default": [call, {"text": "\\boxed{2}"}]}))
    provider_cfg = ProviderConfig(
        name="offline", model="flowllm-emulator", emulator_script=str(script), tool_protocol="native"
    )
    with Recorder(tmp_path / "run") as recorder:
        agent = Agent(
            pipeline_from_config(plain_config(pipeline_cfg.pipeline)),
            make_runner("graph"),
            AgentSettings(max_turns=1),
            recorder,
        )
        async with open_provider(provider_cfg) as provider:
            result = await agent.run("t", "What is 1+1?", provider, tools=OneTool())
    assert (result.turns, result.stop, result.answer) == (2, STOP_MAX_TURNS, "2")
    task = tmp_path / "run" / "tasks" / "t"
    first = read_json(task / "turn_001" / "03_call_model" / "output.json")["raw_request"]
    summary = read_json(task / "turn_002" / "03_call_model" / "output.json")["raw_request"]
    assert [t["name"] for t in first["tools"]] == ["tool-math-calculate"]
    assert "tools" not in summary and "tool_choice" not in summary
