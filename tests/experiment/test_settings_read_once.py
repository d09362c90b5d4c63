"""The run's settings are checked once, where the config is read (flowllm/setup): every wrong number is one
line of the same problem list, a ConfigError of the error tree, before anything is built."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from omegaconf import DictConfig

from flowllm.setup.build import prepare_parts
from flowllm.setup.settings import check_settings, spending_settings

from .helpers import gaia_overrides

Compose = Callable[[Sequence[str]], DictConfig]


def test_every_wrong_number_is_one_line_of_the_problem_list(composed: Compose) -> None:
    cfg = composed(gaia_overrides("agent.max_turns=0", "+subagents=analyst", "subagents.analyst.max_turns=0"))
    parts, _, problems = prepare_parts(cfg)
    assert parts is None
    assert problems == [
        "agent.max_turns must be at least 1, not 0",
        "subagents.analyst.max_turns must be at least 1, not 0",
    ]
    _, _, problems = prepare_parts(composed(gaia_overrides("experiment.task_timeout_s=0")))
    assert problems == ["experiment.task_timeout_s must be a positive number of seconds, not 0.0"]


def test_the_prepared_run_carries_the_settings_it_read(composed: Compose) -> None:
    cfg = composed(gaia_overrides("experiment.attempts=2", "experiment.budget.cost_usd=5", "agent.limits.turns=3"))
    check_settings(cfg)
    parts, _, problems = prepare_parts(cfg)
    assert problems == [] and parts is not None
    assert parts.experiment.attempts == 2
    assert (parts.experiment.limits, parts.experiment.budget) == spending_settings(cfg)
    assert parts.experiment.budget.cost_usd == 5 and parts.experiment.limits.turns == 3
    assert {spec.name for spec in parts.tools.servers} == {name for name in cfg.tools.servers}
