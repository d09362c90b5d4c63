"""conf/tools/*.yaml compose against the ToolsConfig schema and mean what they say."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from flowllm.config.schema import register_configs
from flowllm.tools.pool import ToolPool, load_settings

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
TOOL_SETS = sorted(p.stem for p in (CONF_DIR / "tools").glob("*.yaml"))


def compose_tools(name: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(overrides=[f"+tools={name}"]).tools


@pytest.mark.parametrize("name", TOOL_SETS)
def test_every_tool_set_composes_and_its_python_servers_exist(name: str) -> None:
    cfg = compose_tools(name)
    settings = load_settings(cfg)
    assert cfg.name == name
    for spec in settings.servers:
        if spec.uses_our_python:
            assert spec.executable() == sys.executable
            module = spec.args[spec.args.index("-m") + 1]
            assert importlib.util.find_spec(module) is not None, module


def test_default_has_the_three_builtin_servers() -> None:
    settings = load_settings(compose_tools("default"))
    assert [s.name for s in settings.servers] == ["tool-python", "tool-files", "tool-math"]
    python = settings.servers[0]
    # run_python's own wall clock must stay under the pool's, so the sandbox reports a slow script itself.
    sandbox_timeout = float(python.args[python.args.index("--timeout-s") + 1])
    assert sandbox_timeout < python.timeout_s


def test_web_tools_are_disabled_with_a_warning_without_their_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    settings = load_settings(compose_tools("web"))
    search = next(s for s in settings.servers if s.name == "tool-search")
    assert search.requires_env == ("SERPER_API_KEY",)
    with caplog.at_level(logging.WARNING, logger="flowllm.tools.pool"):
        pool = ToolPool(settings, tmp_path)  # disabling happens before any process starts
    assert set(pool.unavailable) == {"tool-search"}
    assert "SERPER_API_KEY not set" in caplog.text


def test_a_server_without_a_command_is_a_config_error() -> None:
    with pytest.raises(ValueError, match=r"tools.servers.broken: a server needs a 'command'"):
        load_settings({"servers": {"broken": {"args": ["x"]}}})
