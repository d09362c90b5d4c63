"""A pipeline that cannot serve the agent loop is refused when it is built, not when the first task fails."""

from __future__ import annotations

import os

import pytest
from hydra import compose, initialize_config_dir

from flowllm.agent.loop import Agent
from flowllm.agent.results import AgentSettings
from flowllm.agent.turn import AGENT_TURN, TurnOutcome
from flowllm.config.plain import plain_config
from flowllm.config.schema import register_configs
from flowllm.core.types import ModelResponse
from flowllm.engine import NodeContractError, PipelineError, build_pipeline, make_runner
from flowllm.engine.contract import Port, TurnContract
from flowllm.engine.pipeline import pipeline_from_config
from flowllm.resources import CONFIG_DIR
from tests.appfork import run_app


def compose_cfg(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_the_default_pipeline_satisfies_the_contract() -> None:
    pipeline = pipeline_from_config(plain_config(compose_cfg().pipeline), contract=AGENT_TURN)
    assert pipeline.contract is AGENT_TURN
    assert pipeline.provided == ("messages", "system", "tools")


def test_a_pipeline_without_dispatch_is_refused_with_one_line() -> None:
    cfg = compose_cfg("~pipeline.nodes.dispatch_tools")
    with pytest.raises(PipelineError) as err:
        pipeline_from_config(plain_config(cfg.pipeline), source="conf/pipeline/agent_turn.yaml", contract=AGENT_TURN)
    message = str(err.value)
    assert "\n" not in message
    assert "reads 'next_messages'" in message and "no node produces it" in message
    assert message.startswith("conf/pipeline/agent_turn.yaml")


def test_an_output_renamed_away_is_refused() -> None:
    cfg = compose_cfg("+pipeline.nodes.normalize.outputs={response: reply}")
    with pytest.raises(PipelineError, match="'response'"):
        pipeline_from_config(plain_config(cfg.pipeline), contract=AGENT_TURN)


def test_a_declared_output_type_the_caller_cannot_use_is_refused() -> None:
    contract = TurnContract("caller", consumes=(Port("value", int),), produces=(Port("total", str),))
    nodes = {"add": {"_target_": "tests.engine.nodes_for_tests.TypedAdd"}}
    with pytest.raises(PipelineError, match="produces 'total' as int, but the caller needs str"):
        build_pipeline(nodes, contract=contract)
    ok = TurnContract("caller", consumes=(Port("value", int),), produces=(Port("total", int),))
    assert build_pipeline(nodes, contract=ok).provided == ("value",)


def test_the_agent_checks_a_pipeline_built_without_the_contract() -> None:
    pipeline = pipeline_from_config(plain_config(compose_cfg("~pipeline.nodes.dispatch_tools").pipeline))
    with pytest.raises(PipelineError, match="next_messages"):
        Agent(pipeline, make_runner("graph"), AgentSettings(max_turns=2))


def test_the_outcome_is_type_checked_at_the_end_of_a_turn() -> None:
    response = ModelResponse(text="hi", stop_reason="end_turn")
    outcome = TurnOutcome.from_state({"response": response, "next_messages": [], "tool_calls": []})
    assert outcome.response is response and not outcome.called_tools
    with pytest.raises(NodeContractError, match="'next_messages' as dict"):
        TurnOutcome.from_state({"response": response, "next_messages": {}})
    with pytest.raises(NodeContractError, match="without 'response'"):
        TurnOutcome.from_state({"next_messages": []})


def test_the_command_line_refuses_the_pipeline_before_any_task(tmp_path) -> None:
    proc = run_app(
        ["~pipeline.nodes.dispatch_tools", f"hydra.run.dir={tmp_path}"], cwd=tmp_path, timeout=600, env=dict(os.environ)
    )
    assert proc.returncode == 2
    # One error line (preflight may also say what it is checking), no traceback.
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flowllm: error")]
    assert len(errors) == 1 and "next_messages" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "tasks").exists()
