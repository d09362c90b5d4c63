"""The providers guide's "conf/provider/claude.yaml as shipped" block (docs/guides/providers.md) says what the
shipped file holds, key by key."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from flowllm.config.schema import register_configs
from tests.manual import page

ROOT = Path(__file__).resolve().parents[2]


def test_the_manual_block_matches_the_shipped_claude_provider() -> None:
    text = page("guides/providers.md")
    block = re.search(r"```yaml\n# conf/provider/claude\.yaml as shipped.*?\n(.*?)```", text, re.DOTALL)
    assert block is not None
    shown = yaml.safe_load(block.group(1))
    register_configs()
    with initialize_config_dir(str(ROOT / "flowllm" / "conf"), version_base="1.3"):
        provider = OmegaConf.to_container(compose("config", overrides=["provider=claude"]).provider, resolve=True)
    assert isinstance(provider, dict)
    assert shown_part(provider, shown) == shown


def shown_part(actual: object, shown: object) -> object:
    """``actual`` cut down to the keys the manual shows (a nested mapping shows only some of its keys)."""
    if isinstance(shown, dict) and isinstance(actual, dict):
        return {key: shown_part(actual.get(key), value) for key, value in shown.items()}
    return actual
