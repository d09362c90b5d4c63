"""The run-level wiring of the web tools: the composed tools=web config, the search key resolver, where the web
cache lives in a run and in a replay, and bad settings as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from flowllm.config.plain import plain_config
from flowllm.config.schema import register_configs
from flowllm.errors import ConfigError
from flowllm.setup.webconf import cache_env, check_web_tools, web_tools
from flowllm.tools import load_settings
from flowllm.tools.web.cache import CACHE_ENV, CACHE_MODE_ENV
from flowllm.tools.web.guard import BLOCK_ENV

CONF = Path(__file__).resolve().parents[2] / "flowllm" / "conf"
register_configs()


def composed(*overrides: str):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_tools_web_runs_only_flowllms_own_servers_and_names_the_backends_key() -> None:
    cfg = composed("tools=web", "tools.search.backend=tavily")
    servers = cfg.tools.servers
    assert {"tool-search", "tool-browse", "tool-audio"} <= set(servers)
    assert all(s.command == "python" for s in servers.values())  # nothing fetched with npx at run time
    assert list(servers["tool-search"].requires_env) == ["TAVILY_API_KEY"]
    assert list(composed("tools=web", "tools.search.backend=searxng").tools.servers["tool-search"].requires_env) == []


def test_bad_settings_are_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^tools\.search\.backend must be one of serper, .*, not 'bing'$"):
        check_web_tools(composed("tools=web", "tools.search.backend=bing"))
    # replay.tools is an enum of the structured config: composing refuses another value, naming both.
    with pytest.raises(Exception, match=r"replay.tools=sometimes") as refused:
        composed("tools=web", "replay.tools=sometimes")
    assert "expected one of [saved, live]" in str(refused.value.__cause__)


def test_the_cache_is_the_runs_own_or_in_a_replay_the_replayed_runs(tmp_path: Path) -> None:
    cfg = composed("tools=web")
    assert cache_env(cfg, tmp_path) == {CACHE_ENV: str(tmp_path / "web_cache"), CACHE_MODE_ENV: "rw"}
    old = tmp_path / "old"
    replay = composed("tools=web", "provider=replay", f"provider.run_dir={old}")
    assert cache_env(replay, tmp_path / "new") == {CACHE_ENV: str(old / "web_cache"), CACHE_MODE_ENV: "replay"}
    live = composed("tools=web", "provider=replay", f"provider.run_dir={old}", "replay.tools=live")
    assert cache_env(live, tmp_path / "new")[CACHE_MODE_ENV] == "rw"


async def test_the_fixture_server_and_the_cache_reach_every_server(tmp_path: Path) -> None:
    cfg = composed("tools=web", "tools.web_fixtures=true")
    async with web_tools(cfg, tmp_path) as web:
        url = web.fixtures_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        settings = web.apply(load_settings(plain_config(cfg.tools)))
        env = dict(next(spec for spec in settings.servers if spec.name == "tool-browse").env)
        # the contamination guard's denylist goes to every web server too (tests/tools/test_guard.py)
        assert "huggingface.co/datasets/gaia-benchmark/GAIA" in json.loads(env.pop(BLOCK_ENV))
        assert env == {"FLOWLLM_WEB_FIXTURES": url, CACHE_ENV: str(tmp_path / "web_cache"), CACHE_MODE_ENV: "rw"}


async def test_a_remote_server_beside_the_web_tools_gets_no_environment_and_is_accepted(tmp_path: Path) -> None:
    cfg = composed("tools=web", "tools.web_fixtures=true", "+tools.servers.remote.url=http://127.0.0.1:9/mcp")
    async with web_tools(cfg, tmp_path) as web:
        # refused before: env on a url server
        specs = {spec.name: spec for spec in web.apply(load_settings(plain_config(cfg.tools))).servers}
        assert specs["remote"].remote and not specs["remote"].env
        assert "FLOWLLM_WEB_FIXTURES" in specs["tool-browse"].env


async def test_a_fork_serves_the_saved_runs_results_and_keeps_new_ones_in_its_own_cache(tmp_path: Path) -> None:
    """provider.fork=live: the replayed prefix's searches come from the saved run's cache, what the live part
    asks anew is fetched and kept in the fork's own cache; the saved run's cache is never written."""
    from flowllm.tools.web.cache import WebCache

    old, new = tmp_path / "old", tmp_path / "new"

    async def fetched(text: str) -> str:
        return text

    await WebCache(old / "web_cache").get("search", {"query": "saved"}, lambda: fetched("the saved result"))
    assert (old / "web_cache" / "stats.jsonl").is_file()
    cfg = composed(
        "tools=web", "provider=replay", f"provider.run_dir={old}", "provider.fork=live", "provider.live=offline"
    )
    async with web_tools(cfg, new) as web:
        settings = web.apply(load_settings(plain_config(cfg.tools)))
        env = dict(next(spec for spec in settings.servers if spec.name == "tool-search").env)
        env.pop(BLOCK_ENV)
        assert env == {CACHE_ENV: str(new / "web_cache"), CACHE_MODE_ENV: "rw"}
    assert not (new / "web_cache" / "stats.jsonl").exists()  # the saved run's hit counts are not this run's
    cache = WebCache.from_environment(env)

    async def offline() -> str:
        raise AssertionError("a result the saved run has must not be fetched again")

    assert await cache.get("search", {"query": "saved"}, offline) == "the saved result"
    assert await cache.get("search", {"query": "new"}, lambda: fetched("a live result")) == "a live result"
    assert len(list((new / "web_cache").glob("*/*.json"))) == 2
    assert len(list((old / "web_cache").glob("*/*.json"))) == 1
