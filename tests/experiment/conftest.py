"""Fixtures of the experiment tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import flowllm.app  # noqa: F401  registers the structured configs and ${flowllm_abspath:...}
from tests.experiment.helpers import ROOT


@pytest.fixture
def composed() -> Callable[[Sequence[str]], DictConfig]:
    """Compose conf/ the way `python -m flowllm` does, with overrides, outside of a Hydra run."""

    def make(overrides: Sequence[str], hydra: bool = False) -> DictConfig:
        with initialize_config_dir(str(ROOT / "flowllm" / "conf"), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=hydra)

    return make
