"""One registration style: runners, wire protocols, dataset adapters and scorers are each a ``Registry``."""

from __future__ import annotations

import pytest

from flowllm.core.registry import Registry
from flowllm.datasets.adapters import ADAPTERS
from flowllm.engine.runners import RUNNERS
from flowllm.errors import ConfigError
from flowllm.providers.factory import PROTOCOLS
from flowllm.scoring import SCORERS


def test_every_choice_kind_is_a_registry_with_its_config_key() -> None:
    kinds = {r.key: r.names() for r in (RUNNERS, PROTOCOLS, ADAPTERS, SCORERS)}
    assert kinds == {
        "runner": ["graph", "graph_parallel", "legacy"],
        "provider.protocol": ["anthropic", "openai_chat", "openai_responses", "replay"],
        "dataset.adapter": ["gaia", "table"],
        "dataset.scorer": ["exact", "gaia", "judge"],
    }


def test_a_name_is_registered_once_and_a_wrong_one_lists_the_choices() -> None:
    registry: Registry[int] = Registry("thing", {"one": 1})
    registry.register("two", 2)
    registry.register("two", 2)  # the same item again: harmless (a module imported twice)
    with pytest.raises(ValueError, match="thing: 'two' is registered already"):
        registry.register("two", 3)
    with pytest.raises(ConfigError, match=r"^thing must be one of one, two, not 'three'$"):
        registry.require("three", ConfigError)
    assert registry.require("one", ConfigError) == 1
