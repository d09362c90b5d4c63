"""Which settings a replay run takes from the saved run and which from its own command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

import flowllm.app  # noqa: F401  registers the structured configs
from flowllm.providers.errors import ProviderConfigError
from flowllm.setup.rejudge import inherit_replayed_run

ROOT = Path(__file__).resolve().parents[2]


def composed(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(str(ROOT / "flowllm" / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


def saved_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "tasks").mkdir()
    OmegaConf.save(composed(["+experiment=browsecomp_sample"]), run / ".hydra" / "config.yaml")
    return run


def test_without_an_experiment_the_saved_runs_settings_come_back(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    overrides = ["provider=replay", f"provider.run_dir={run}", "judge.provider=gpt5", "agent.max_turns=2"]
    merged = inherit_replayed_run(composed(overrides), overrides)
    assert merged.experiment.name == "browsecomp_sample"
    assert merged.dataset.adapter == "table" and merged.dataset.decrypt == "sha256_xor"
    assert merged.judge.template == "browsecomp"
    assert merged.provider.protocol == "replay"  # always the new run's
    assert merged.agent.max_turns == 2  # named on the command line
    assert merged.tools.name == "none"
    # Another judge named: the sample's scripted judge does not come along.
    assert merged.judge.provider == "gpt5" and merged.judge.emulator_script is None


def test_keeping_the_saved_judge_keeps_its_script(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    overrides = ["provider=replay", f"provider.run_dir={run}"]
    merged = inherit_replayed_run(composed(overrides), overrides)
    assert merged.judge.provider == "offline"
    assert merged.judge.emulator_script == "data/browsecomp_sample/judge.yaml"


def test_an_experiment_on_the_command_line_is_used_as_composed(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    overrides = ["+experiment=simpleqa_sample", "provider=replay", f"provider.run_dir={run}"]
    cfg = composed(overrides)
    assert inherit_replayed_run(cfg, overrides) is cfg
    plain = ["judge.provider=gpt5"]
    cfg = composed(plain)
    assert inherit_replayed_run(cfg, plain) is cfg  # not a replay: nothing to inherit


def test_a_saved_config_of_another_version_is_one_line(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    config = OmegaConf.load(run / ".hydra" / "config.yaml")
    config.dataset.shape_of_things = "to come"
    OmegaConf.save(config, run / ".hydra" / "config.yaml")
    overrides = ["provider=replay", f"provider.run_dir={run}"]
    with pytest.raises(ProviderConfigError) as err:
        inherit_replayed_run(composed(overrides), overrides)
    assert "\n" not in str(err.value) and "+experiment=" in str(err.value)
