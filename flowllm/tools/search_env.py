"""``${flowllm_search_env:<backend>}`` (conf/tools/web.yaml): the chosen search backend's key variable, as
tool-search's ``requires_env``, so a missing key disables the server with the pool's one warning naming it.

A module of its own because the config schemas register it: it must import nothing that imports them.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from flowllm.tools.search import SearchError, required_env


def _search_env(backend: str) -> list[str]:
    try:
        return required_env(backend)
    except SearchError:
        return []  # check_web_tools reports the bad name as one line before the first task


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("flowllm_search_env", _search_env, replace=True)
