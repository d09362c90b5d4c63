"""The web search backends a config may name, and the variable holding each one's key.

``${flowllm_search_env:<backend>}`` (conf/tools/web.yaml) resolves to the chosen backend's key variable, as
tool-search's ``requires_env``, so a missing key disables the server with the pool's one warning naming it.
It lives with the config schemas, which register it: tool-search (``flowllm.tools.search``) reads the same
table from here.
"""

from __future__ import annotations

from enum import Enum

from omegaconf import OmegaConf


class Backend(Enum):
    SERPER = "serper"
    BRAVE = "brave"
    TAVILY = "tavily"
    SEARXNG = "searxng"


# The variable holding each backend's key (SearXNG is self-hosted: no key, a URL instead).
KEY_ENV: dict[Backend, str | None] = {
    Backend.SERPER: "SERPER_API_KEY",
    Backend.BRAVE: "BRAVE_API_KEY",
    Backend.TAVILY: "TAVILY_API_KEY",
    Backend.SEARXNG: None,
}


def _search_env(backend: str) -> list[str]:
    try:
        key = KEY_ENV[Backend(str(backend).strip().lower())]
    except ValueError:
        return []  # check_web_tools reports the bad name as one line before the first task
    return [key] if key else []


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("flowllm_search_env", _search_env, replace=True)
