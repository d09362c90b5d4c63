"""The run-level side of the web tools: config checks, the ``requires_env`` resolver, the fixture server, the cache.

``${flowllm_search_env:<backend>}`` (conf/tools/web.yaml) gives tool-search the key variable of the chosen
backend as its ``requires_env``, so a missing key disables the server with the pool's one warning naming the
variable. ``web_tools`` starts the loopback fixture server for a run whose ``tools.web_fixtures`` is true;
``WebEnvironment.apply`` hands every local (stdio) tool server its address (``$FLOWLLM_WEB_FIXTURES``) and the
run's web cache (``$FLOWLLM_WEB_CACHE``: ``<run dir>/web_cache``; under ``provider=replay`` the replayed run's,
read-only, unless ``replay.tools=live``). A remote (``url:``) server gets none of it: it is not started here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from flowllm.config.answer_sources import DEFAULT_BLOCK
from flowllm.emulator import Emulator
from flowllm.emulator.script import Script
from flowllm.emulator.web import FIXTURES_ENV, WebFixtures
from flowllm.errors import ConfigError
from flowllm.providers.factory import resolve_script
from flowllm.providers.replay import resolve_run_dir
from flowllm.rundir.layout import RunLayout
from flowllm.tools.audio import AUDIO_BASE_URL_ENV
from flowllm.tools.client.settings import PoolSettings, with_environment
from flowllm.tools.search import SearchError, parse_backend
from flowllm.tools.web.cache import CACHE_ENV, CACHE_MODE_ENV, STATS_FILE, CacheMode
from flowllm.tools.web.guard import BLOCK_ENV, env_value


def check_web_tools(cfg: DictConfig) -> None:
    """Bad web tool settings, as one line before the first task."""
    # replay.tools is a ReplayTools enum in the structured config: Hydra refuses another value.
    tools = cfg.tools
    search = tools.get("search")
    if search is not None and "tool-search" in (tools.get("servers") or {}):
        try:
            parse_backend(search.backend)
        except SearchError as exc:
            raise ConfigError(str(exc)) from None  # the message names tools.search.backend
    block_env(cfg)


def block_env(cfg: DictConfig) -> dict[str, str]:
    """The denylist of benchmark answer sources the web tool servers get (flowllm/tools/web/guard.py)."""
    entries = OmegaConf.select(cfg, "tools.web.block", default=None)
    try:
        return {BLOCK_ENV: env_value(DEFAULT_BLOCK if entries is None else entries)}
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _forking(cfg: DictConfig) -> bool:
    return OmegaConf.select(cfg, "provider.protocol") == "replay" and OmegaConf.select(cfg, "provider.fork") is not None


def seed_fork_cache(cfg: DictConfig, run_dir: Path) -> None:
    """A fork's web cache starts as a copy of the saved run's: the replayed prefix's searches and pages are served
    as they were, and what the live part asks anew is fetched and kept in this run's cache (never the saved run's)."""
    if not _forking(cfg) or cfg.replay.tools != "saved":
        return
    saved = RunLayout(resolve_run_dir(str(cfg.provider.run_dir))).web_cache
    if saved.is_dir():
        shutil.copytree(
            saved, RunLayout(Path(run_dir)).web_cache, ignore=shutil.ignore_patterns(STATS_FILE), dirs_exist_ok=True
        )


def cache_env(cfg: DictConfig, run_dir: Path) -> dict[str, str]:
    """Where the tool servers keep (or, in a replay, find) the run's web results."""
    if _forking(cfg):  # its own cache, seeded with the saved run's (seed_fork_cache)
        return {CACHE_ENV: str(RunLayout(Path(run_dir)).web_cache), CACHE_MODE_ENV: CacheMode.READ_WRITE.value}
    if OmegaConf.select(cfg, "provider.protocol") == "replay" and cfg.replay.tools == "saved":
        old = resolve_run_dir(str(cfg.provider.run_dir))
        return {CACHE_ENV: str(RunLayout(old).web_cache), CACHE_MODE_ENV: CacheMode.REPLAY.value}
    return {CACHE_ENV: str(RunLayout(Path(run_dir)).web_cache), CACHE_MODE_ENV: CacheMode.READ_WRITE.value}


@dataclass(frozen=True)
class WebEnvironment:
    """What ``web_tools`` started for the run: the fixture server's URL (None when off), the environment every
    local tool server gets, and what one server alone gets (the transcription key, to tool-audio)."""

    fixtures_url: str | None
    env: dict[str, str]
    only: dict[str, dict[str, str]]

    def apply(self, settings: PoolSettings) -> PoolSettings:
        """The run's tool settings with this environment in every local server's."""
        return with_environment(settings, self.env, self.only)


@asynccontextmanager
async def web_tools(cfg: DictConfig, run_dir: Path) -> AsyncIterator[WebEnvironment]:
    """The run's web tool environment, while the context lasts (the fixture server, the audio emulator)."""
    env = {**cache_env(cfg, run_dir), **block_env(cfg)}
    await asyncio.to_thread(seed_fork_cache, cfg, run_dir)
    server: WebFixtures | None = None
    emulator: Emulator | None = None
    if cfg.tools.get("web_fixtures"):
        server = WebFixtures()
        env[FIXTURES_ENV] = await asyncio.to_thread(server.start)
    # A replay serving saved results reads the saved transcripts: no transcription endpoint is needed.
    replaying = env[CACHE_MODE_ENV] == CacheMode.REPLAY.value
    if OmegaConf.select(cfg, "tools.audio.emulator", default=False) and not replaying:
        script = OmegaConf.select(cfg, "provider.emulator_script")
        if not script:
            raise ConfigError("tools.audio.emulator needs provider.emulator_script (the transcripts are scripted)")
        emulator = Emulator(Script.load(resolve_script(str(script))))
        await asyncio.to_thread(emulator.start)
        env[AUDIO_BASE_URL_ENV] = emulator.openai_base_url
    try:
        # The transcription key goes to tool-audio alone (servers get a minimal environment otherwise).
        key_env = OmegaConf.select(cfg, "tools.audio.api_key_env", default="")
        only = {"tool-audio": {key_env: os.environ[key_env]}} if key_env and os.environ.get(key_env) else {}
        yield WebEnvironment(env.get(FIXTURES_ENV), env, only)
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
        if emulator is not None:
            await asyncio.to_thread(emulator.stop)
