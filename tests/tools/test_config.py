"""conf/tools/*.yaml compose against the ToolsConfig schema and mean what they say."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from flowllm.config.plain import plain_config
from flowllm.config.schema import register_configs
from flowllm.errors import ToolConfigError
from flowllm.tools.client.pool import ToolPool
from flowllm.tools.client.settings import Scope, Transport, load_settings

CONF_DIR = Path(__file__).resolve().parents[2] / "flowllm" / "conf"
TOOL_SETS = sorted(p.stem for p in (CONF_DIR / "tools").glob("*.yaml"))


def compose_tools(name: str) -> dict[str, Any]:
    """The tools section of a composed config, as the loader hands it on (plain data)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        tools = plain_config(compose(overrides=[f"+tools={name}"]).tools)
    assert isinstance(tools, dict)
    return tools


@pytest.mark.parametrize("name", TOOL_SETS)
def test_every_tool_set_composes_and_its_python_servers_exist(name: str) -> None:
    cfg = compose_tools(name)
    settings = load_settings(cfg)
    assert cfg["name"] == name
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
    with caplog.at_level(logging.WARNING, logger="flowllm.tools.client.pool"):
        pool = ToolPool(settings, tmp_path)  # disabling happens before any process starts
    assert set(pool.unavailable) == {"tool-search"}
    assert "SERPER_API_KEY not set" in caplog.text


BAD_ENTRIES = [
    ({"args": ["x"]}, r"tools.servers.broken: give either a 'command' .* or a 'url'"),
    ({"command": ""}, r"the command is empty"),
    ({"command": "x", "url": "http://127.0.0.1:1/mcp"}, r"not both"),
    ({"command": "x", "cwdd": "/tmp"}, r"unknown key\(s\) cwdd \(did you mean 'cwd'\?\)"),
    ({"url": "ftp://host/mcp"}, r"url must start with http"),
    ({"url": "http://127.0.0.1:1/mcp", "transport": "carrier-pigeon"}, r"transport must be one of stdio"),
    ({"url": "http://127.0.0.1:1/mcp", "args": ["a"]}, r"args, env and cwd are for local servers"),
    ({"command": "x", "scope": "forever"}, r"scope must be one of task, run"),
    ({"command": "x", "scope": "run", "args": ["${workspace}"]}, r"scope=run starts the server once"),
    ({"command": "x", "args": "not-a-list"}, r"args must be a list"),
]


@pytest.mark.parametrize(("entry", "message"), BAD_ENTRIES)
def test_a_bad_server_entry_is_one_tool_config_error(entry: dict, message: str) -> None:
    with pytest.raises(ToolConfigError, match=message):
        load_settings({"servers": {"broken": entry}})


def test_remote_entries_default_to_streamable_http_and_run_scope_with_headers_from_the_environment() -> None:
    settings = load_settings(
        {"servers": {"r": {"url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "MY_TOKEN"}}}}
    )
    (spec,) = settings.servers
    assert (spec.transport, spec.scope, spec.remote) == (Transport.STREAMABLE_HTTP, Scope.RUN, True)
    assert spec.missing_env({}) == ["MY_TOKEN"]
    assert spec.header_values({"MY_TOKEN": "Bearer t"}) == {"Authorization": "Bearer t"}


def test_workspace_is_substituted_in_args_env_and_cwd_even_through_hydra(tmp_path: Path) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            overrides=[
                "+tools=default",
                "+tools.servers.ws={command: python, args: ['${workspace}/x'], cwd: '${workspace}'}",
                "+tools.servers.ws.env={WHERE: 'in ${workspace}'}",
            ]
        ).tools
    spec = next(s for s in load_settings(plain_config(cfg)).servers if s.name == "ws").for_workspace(tmp_path)
    assert (spec.args, spec.cwd, dict(spec.env)) == ((f"{tmp_path}/x",), str(tmp_path), {"WHERE": f"in {tmp_path}"})


def test_an_empty_command_on_the_command_line_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(CONF_DIR.parents[1])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowllm",
            "progress=false",
            "tools.servers.tool-math.command=''",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [
        "flowllm: error: tools.servers.tool-math: give either a 'command' (a local server over stdio) "
        "or a 'url' (a remote server); the command is empty"
    ]


async def test_a_disabled_server_is_warned_about_once_per_run_however_many_tasks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flowllm.tools import open_tool_catalog, open_tool_pool

    monkeypatch.delenv("FLOWLLM_NO_SUCH_KEY", raising=False)
    cfg = {"servers": {"keyed": {"command": "python", "args": ["-c", "pass"], "requires_env": ["FLOWLLM_NO_SUCH_KEY"]}}}
    with caplog.at_level(logging.WARNING, logger="flowllm.tools.client.pool"):
        async with open_tool_catalog(cfg) as catalog:
            for task in ("a", "b", "c"):  # three tasks of one run
                (tmp_path / task).mkdir()
                async with open_tool_pool(cfg, tmp_path / task, catalog=catalog) as pool:
                    assert "FLOWLLM_NO_SUCH_KEY not set" in pool.unavailable["keyed"]
    assert caplog.text.count("server 'keyed' is disabled") == 1
    assert catalog.unavailable == {"keyed": pool.unavailable["keyed"]}
