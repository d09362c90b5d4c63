"""The runner's timeouts: one default shared by config and code, and the old key's name still honoured."""

from __future__ import annotations

import logging

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from flowllm.config.schema import RunnerConfig, register_configs
from flowllm.core.timeouts import FANOUT_TIMEOUT_S, ITEM_TIMEOUT_S
from flowllm.engine import FanOut, make_runner
from flowllm.engine.runners import RUNNERS, runner_from_config
from flowllm.resources import CONFIG_DIR


def runner_section(*overrides: str) -> RunnerConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        section = OmegaConf.to_object(compose(config_name="config", overrides=list(overrides)).runner)
    assert isinstance(section, RunnerConfig)
    return section


@pytest.mark.parametrize("name", sorted(RUNNERS))
def test_config_and_code_share_one_default(name: str) -> None:
    runner = runner_from_config(runner_section(f"runner={name}"))
    coded = make_runner(name)
    assert (runner.item_timeout_s, runner.fanout_timeout_s) == (ITEM_TIMEOUT_S, FANOUT_TIMEOUT_S)
    assert (coded.item_timeout_s, coded.fanout_timeout_s) == (ITEM_TIMEOUT_S, FANOUT_TIMEOUT_S)
    assert (FanOut().item_timeout_s, FanOut().total_timeout_s) == (ITEM_TIMEOUT_S, FANOUT_TIMEOUT_S)


def test_the_new_key_sets_the_fanout_bound(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        runner = runner_from_config(runner_section("runner.fanout_timeout_s=42"))
    assert runner.fanout_timeout_s == 42
    assert "deprecated" not in caplog.text


def test_the_old_key_still_works_and_says_it_is_deprecated(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        runner = runner_from_config(runner_section("runner.turn_timeout_s=7"))
    assert runner.fanout_timeout_s == 7
    warnings = [r.getMessage() for r in caplog.records if "turn_timeout_s" in r.getMessage()]
    assert warnings == ["runner.turn_timeout_s is deprecated: it is runner.fanout_timeout_s now (used 7s)"]
