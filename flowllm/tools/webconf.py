"""The run-level side of the web tools: config checks, the ``requires_env`` resolver, the web fixture server.

``${flowllm_search_env:<backend>}`` (conf/tools/web.yaml) gives tool-search the key variable of the chosen
backend as its ``requires_env``, so a missing key disables the server with the pool's one warning naming the
variable. ``web_fixtures`` starts the loopback fixture server for a run whose ``tools.web_fixtures`` is true and
hands its address to every tool server in ``$FLOWLLM_WEB_FIXTURES``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from flowllm.emulator.web import FIXTURES_ENV, WebFixtures
from flowllm.errors import ConfigError
from flowllm.tools.search import SearchError, parse_backend, required_env


def _search_env(backend: str) -> list[str]:
    try:
        return required_env(backend)
    except SearchError:
        return []  # check_web_tools reports the bad name as one line before the first task


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("flowllm_search_env", _search_env, replace=True)


def check_web_tools(tools: DictConfig) -> None:
    """Bad web tool settings, as one line before the first task."""
    search = tools.get("search")
    if search is not None and "tool-search" in (tools.get("servers") or {}):
        try:
            parse_backend(search.backend)
        except SearchError as exc:
            raise ConfigError(f"tools.search.backend: {exc}") from None


@asynccontextmanager
async def web_fixtures(tools: DictConfig) -> AsyncIterator[str | None]:
    """The fixture server for the run (its URL), or nothing when ``tools.web_fixtures`` is off."""
    if not tools.get("web_fixtures"):
        yield None
        return
    server = WebFixtures()
    url = await asyncio.to_thread(server.start)
    try:
        servers: Any = tools.get("servers") or {}
        with open_dict(tools):
            for entry in servers.values():
                entry.env[FIXTURES_ENV] = url
        yield url
    finally:
        await asyncio.to_thread(server.stop)


register_resolvers()
