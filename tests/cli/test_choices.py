"""Every enum choice of the config schema is accepted as the manual (README and docs/) writes it, in any case, and a
bad one is refused with the choices listed in that spelling."""

from __future__ import annotations

import re
from collections.abc import Iterator
from enum import Enum

import pytest
from omegaconf import DictConfig, OmegaConf
from omegaconf.nodes import EnumNode

from flowllm.config.check import check_command_line
from flowllm.config.schema import SCHEMAS, FlowConfig
from tests.manual import manual_text

MANUAL = manual_text()


def _enum_fields(node: DictConfig, prefix: str) -> Iterator[tuple[str, type[Enum]]]:
    for key in node:
        child = node._get_node(key)
        if isinstance(child, EnumNode):
            yield f"{prefix}{key}", child.enum_type
        elif isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            yield from _enum_fields(child, f"{prefix}{key}.")


def _choices() -> dict[str, type[Enum]]:
    found = dict(_enum_fields(OmegaConf.structured(FlowConfig), ""))
    for group, schema in SCHEMAS.items():
        found.update(_enum_fields(OmegaConf.structured(schema), f"{group}."))
    return found


CHOICES = _choices()


def test_the_schema_has_the_choices_the_manual_names() -> None:
    assert {"stats.interval", "experiment.epoch_reducer", "recorder.snapshot", "replay.tools"} <= set(CHOICES)


@pytest.mark.parametrize("path", sorted(CHOICES))
def test_a_choice_is_accepted_as_the_manual_writes_it_in_any_case(path: str) -> None:
    enum = CHOICES[path]
    written = re.findall(re.escape(path) + r"=(\w+)", MANUAL) or [next(iter(enum)).value]
    for value in dict.fromkeys(written):
        for spelled in (value, value.upper(), value.capitalize()):
            assert check_command_line([f"{path}={spelled}"]) == [], f"{path}={spelled}"
    listed = ", ".join(str(member.value) for member in enum)
    problems = check_command_line([f"{path}=not_a_choice"])
    assert len(problems) == 1 and f"expected one of [{listed}]" in problems[0], problems
