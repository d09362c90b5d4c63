"""The replay provider on its own: lookups, the source protocol, and every way a saved run can fall short."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import yaml

from flowllm.config.provider_schema import ProviderConfig
from flowllm.core.interfaces import CallContext
from flowllm.engine.recorder import read_json
from flowllm.providers import ProviderConfigError, open_provider
from flowllm.providers.replay import ReplayMissError, build_replay_provider, source_provider_config
from tests.replay.runs import CLEAN_TASK, LENIENT_TASK, FixtureRuns

CALL = "turn_001/03_call_model/output.json"


def replay_cfg(run_dir: Path | str | None) -> ProviderConfig:
    return ProviderConfig(name="replay", protocol="replay", model="replay", run_dir=str(run_dir) if run_dir else None)


def copy_run(runs: FixtureRuns, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(runs.original.run_dir, target, ignore=shutil.ignore_patterns("workspace"))
    return target


async def test_serves_the_saved_reply_and_reads_it_with_the_source_protocol(runs: FixtureRuns) -> None:
    saved = read_json(runs.original.run_dir / "tasks" / LENIENT_TASK / CALL)
    async with open_provider(replay_cfg(runs.original.run_dir)) as provider:
        # The old run used the offline Anthropic provider: its protocol and tool protocol carry over.
        assert (provider.name, provider.protocol, provider.tool_protocol) == ("replay", "anthropic", "xml")
        raw = await provider.send(saved["raw_request"], context=CallContext(LENIENT_TASK, 1))
        assert raw == saved["raw_response"]
        response = provider.normalize(raw)
    assert "<use_mcp_tool>" in response.text
    assert response.usage.input_tokens > 0


async def test_a_changed_request_is_served_and_logged_once_per_task(
    runs: FixtureRuns, caplog: pytest.LogCaptureFixture
) -> None:
    saved = read_json(runs.original.run_dir / "tasks" / CLEAN_TASK / CALL)
    request = {**saved["raw_request"], "max_tokens": 7}
    provider = build_replay_provider(replay_cfg(runs.original.run_dir))
    with caplog.at_level(logging.WARNING, logger="flowllm.providers.replay"):
        first = await provider.send(request, context=CallContext(CLEAN_TASK, 1))
        await provider.send(request, context=CallContext(CLEAN_TASK, 1))
    await provider.aclose()
    assert first == saved["raw_response"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert f"task {CLEAN_TASK} turn 1" in warnings[0] and "max_tokens" in warnings[0]
    assert provider.diverged == {CLEAN_TASK: f"turn 1: max_tokens: {saved['raw_request']['max_tokens']} vs 7"}


@pytest.mark.parametrize(
    ("task", "turn", "agent", "expected"),
    [
        ("no-such-task", 1, "main", "task 'no-such-task' turn 1: the replayed run .* has no such task"),
        (CLEAN_TASK, 9, "main", f"task '{CLEAN_TASK}' turn 9: the replayed run never made this turn .it made turns"),
        (CLEAN_TASK, 1, "browser", f"task '{CLEAN_TASK}' \\(sub-agent 'browser'\\) turn 1: .*recorded no turns"),
    ],
)
async def test_a_call_the_old_run_cannot_answer_names_task_and_turn(
    runs: FixtureRuns, task: str, turn: int, agent: str, expected: str
) -> None:
    provider = build_replay_provider(replay_cfg(runs.original.run_dir))
    with pytest.raises(ReplayMissError, match=expected) as info:
        scope = "" if agent == "main" else f"turn_001/subagents/{agent}-call_0"
        await provider.send({}, context=CallContext(task, turn, agent, scope))
    assert (info.value.task_id, info.value.turn, info.value.agent) == (task, turn, agent)
    await provider.aclose()


async def test_a_call_node_at_another_place_in_the_pipeline_is_still_found(runs: FixtureRuns, tmp_path: Path) -> None:
    """The call folder's name is remembered from turn to turn; where a conversation's differs (another agent's
    pipeline), the reply is still the one saved there."""
    run = copy_run(runs, tmp_path)
    turn = run / "tasks" / CLEAN_TASK / "turn_001"
    (turn / "03_call_model").rename(turn / "05_call_model")
    saved = {
        LENIENT_TASK: read_json(run / "tasks" / LENIENT_TASK / CALL)["raw_response"],
        CLEAN_TASK: read_json(turn / "05_call_model" / "output.json")["raw_response"],
    }
    assert saved[LENIENT_TASK] != saved[CLEAN_TASK]
    provider = build_replay_provider(replay_cfg(run))
    try:
        for task in (LENIENT_TASK, CLEAN_TASK, LENIENT_TASK):
            assert await provider.send({}, context=CallContext(task, 1)) == saved[task]
    finally:
        await provider.aclose()


async def test_a_truncated_reply_is_reported_not_served(runs: FixtureRuns, tmp_path: Path) -> None:
    run = copy_run(runs, tmp_path)
    path = run / "tasks" / LENIENT_TASK / CALL
    path.write_bytes(path.read_bytes()[:200])
    provider = build_replay_provider(replay_cfg(run))
    with pytest.raises(ReplayMissError, match=r"cannot serve 03_call_model: output\.json is not valid JSON"):
        await provider.send({}, context=CallContext(LENIENT_TASK, 1))
    # The other task of the same run is unaffected.
    assert await provider.send({}, context=CallContext(CLEAN_TASK, 1))
    await provider.aclose()


async def test_a_call_that_failed_in_the_old_run_says_so(runs: FixtureRuns, tmp_path: Path) -> None:
    run = copy_run(runs, tmp_path)
    node = run / "tasks" / LENIENT_TASK / "turn_001" / "03_call_model"
    (node / "output.json").unlink()
    meta = read_json(node / "meta.json")
    meta.update(status="error", error="ProviderCallError: rate_limit (HTTP 429): slow down")
    (node / "meta.json").write_text(json.dumps(meta))
    provider = build_replay_provider(replay_cfg(run))
    with pytest.raises(ReplayMissError, match="the original call failed: ProviderCallError: rate_limit"):
        await provider.send({}, context=CallContext(LENIENT_TASK, 1))
    await provider.aclose()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("none", "provider=replay needs the run to replay: add provider.run_dir="),
        ("absent", "is not a directory"),
        ("empty", "is not a flowllm run \\(no tasks/ folder\\)"),
        ("no-config", "has no .hydra/config.yaml"),
    ],
)
def test_bad_run_dirs_are_config_errors_with_what_to_do(tmp_path: Path, setup: str, message: str) -> None:
    run_dir: Path | None = tmp_path / "run"
    if setup == "none":
        run_dir = None
    elif setup == "empty":
        tmp_path.joinpath("run").mkdir()
    elif setup == "no-config":
        tmp_path.joinpath("run", "tasks").mkdir(parents=True)
    with pytest.raises(ProviderConfigError, match=message):
        build_replay_provider(replay_cfg(run_dir))


def _fake_replay_run(path: Path, points_at: Path) -> Path:
    (path / ".hydra").mkdir(parents=True)
    (path / "tasks").mkdir()
    config = {"provider": {"name": "replay", "protocol": "replay", "model": "replay", "run_dir": str(points_at)}}
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def test_a_replay_of_a_replay_reads_with_the_origins_protocol(runs: FixtureRuns, tmp_path: Path) -> None:
    second = _fake_replay_run(tmp_path / "second", runs.original.run_dir)
    third = _fake_replay_run(tmp_path / "third", second)
    cfg, chain = source_provider_config(third)
    assert cfg.protocol == "anthropic" and cfg.model == "flowllm-emulator"
    assert chain == [third, second, runs.original.run_dir]


def test_a_replay_chain_that_loops_is_refused(tmp_path: Path) -> None:
    a = tmp_path / "a"
    _fake_replay_run(a, tmp_path / "b")
    _fake_replay_run(tmp_path / "b", a)
    with pytest.raises(ProviderConfigError, match="the replay chain loops"):
        source_provider_config(a)
