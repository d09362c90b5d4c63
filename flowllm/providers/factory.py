"""Opening a configured provider: key lookup, the offline emulator, the SDK client.

``check_provider_config`` runs before any task starts and raises ``ProviderConfigError`` with one line that
says what to do. ``open_provider`` is the async context manager the experiment holds for the whole run; with
``emulator_script`` set it also runs the loopback emulator for that lifetime and points the SDK at it.

A new wire protocol is one ``register_protocol`` call (the replay provider plugs in the same way).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from flowllm.config.schema import ProviderConfig
from flowllm.core.interfaces import Provider
from flowllm.providers.base import BaseProvider, as_provider_config
from flowllm.providers.errors import ProviderConfigError

# Sent instead of a key to servers that need none (the emulator, a local vLLM/SGLang/Ollama): the SDKs insist
# on having one.
DUMMY_KEY = "flowllm-no-key"
NO_KEY_PROVIDERS = frozenset({"local", "offline"})


@dataclass(frozen=True)
class Endpoint:
    """Where and how to reach the server: the resolved base URL and key (never logged, never saved)."""

    base_url: str | None
    api_key: str

    def __repr__(self) -> str:
        return f"Endpoint(base_url={self.base_url!r}, api_key=<hidden>)"


ProviderBuilder = Callable[[ProviderConfig, Endpoint], BaseProvider]
CustomOpener = Callable[[ProviderConfig], Awaitable[Provider]]


def _build_anthropic(cfg: ProviderConfig, endpoint: Endpoint) -> BaseProvider:
    import anthropic

    from flowllm.providers.anthropic import AnthropicProvider

    kwargs: dict[str, Any] = {"base_url": endpoint.base_url, "max_retries": 0, "timeout": cfg.timeout_s}
    if cfg.auth == "x-api-key":
        # anthropic 2.x sends Authorization: Bearer; endpoints that want x-api-key get it as a header instead,
        # with the bearer header omitted (never both).
        kwargs["api_key"] = endpoint.api_key
        kwargs["default_headers"] = {"x-api-key": endpoint.api_key, "Authorization": anthropic.Omit()}
    else:
        kwargs["api_key"] = endpoint.api_key
    return AnthropicProvider(cfg, anthropic.AsyncAnthropic(**kwargs))


def _openai_client(cfg: ProviderConfig, endpoint: Endpoint) -> Any:
    import openai

    return openai.AsyncOpenAI(
        api_key=endpoint.api_key, base_url=endpoint.base_url, max_retries=0, timeout=cfg.timeout_s
    )


def _build_openai_chat(cfg: ProviderConfig, endpoint: Endpoint) -> BaseProvider:
    from flowllm.providers.openai_chat import OpenAIChatProvider

    return OpenAIChatProvider(cfg, _openai_client(cfg, endpoint))


def _build_openai_responses(cfg: ProviderConfig, endpoint: Endpoint) -> BaseProvider:
    from flowllm.providers.openai_responses import OpenAIResponsesProvider

    return OpenAIResponsesProvider(cfg, _openai_client(cfg, endpoint))


_BUILDERS: dict[str, ProviderBuilder] = {
    "anthropic": _build_anthropic,
    "openai_chat": _build_openai_chat,
    "openai_responses": _build_openai_responses,
}
_CUSTOM: dict[str, CustomOpener] = {}


def register_protocol(name: str, opener: CustomOpener) -> None:
    """Plug in a provider that is not an SDK wire protocol (``replay``): ``opener(cfg)`` returns the
    Provider."""
    _CUSTOM[name] = opener


def known_protocols() -> list[str]:
    return sorted({*_BUILDERS, *_CUSTOM})


def resolve_script(path: str) -> Path:
    """The emulator script: as given (relative to the working directory), else relative to the project
    root."""
    candidate = Path(path).expanduser()
    if candidate.is_file():
        return candidate
    project_root = Path(__file__).resolve().parents[2]
    if not candidate.is_absolute() and (project_root / candidate).is_file():
        return project_root / candidate
    raise ProviderConfigError(f"provider.emulator_script: file not found: {path}")


def _needs_key(cfg: ProviderConfig) -> bool:
    return not cfg.emulator_script and cfg.name not in NO_KEY_PROVIDERS and bool(cfg.api_key_env)


def check_provider_config(cfg: ProviderConfig | DictConfig | dict[str, Any]) -> None:
    """Raise ``ProviderConfigError`` if ``cfg`` cannot work; opens nothing, calls nothing."""
    pcfg = as_provider_config(cfg)
    if pcfg.protocol not in _BUILDERS and pcfg.protocol not in _CUSTOM:
        raise ProviderConfigError(
            f"provider '{pcfg.name}': unknown protocol '{pcfg.protocol}' (expected one of "
            f"{', '.join(known_protocols())})"
        )
    if pcfg.protocol in _CUSTOM:
        return
    if pcfg.tool_protocol not in ("xml", "native"):
        raise ProviderConfigError(f"provider.tool_protocol must be xml or native, not '{pcfg.tool_protocol}'")
    if pcfg.thinking.mode not in ("enabled", "adaptive", "disabled"):
        raise ProviderConfigError(
            f"provider.thinking.mode must be enabled, adaptive or disabled, not '{pcfg.thinking.mode}'"
        )
    if pcfg.auth not in ("bearer", "x-api-key"):
        raise ProviderConfigError(f"provider.auth must be bearer or x-api-key, not '{pcfg.auth}'")
    if pcfg.cache.ttl not in ("5m", "1h"):
        raise ProviderConfigError(f"provider.cache.ttl must be 5m or 1h, not '{pcfg.cache.ttl}'")
    if pcfg.emulator_script:
        resolve_script(pcfg.emulator_script)
        return
    if _needs_key(pcfg) and not os.environ.get(str(pcfg.api_key_env)):
        raise ProviderConfigError(
            f"provider '{pcfg.name}' needs an API key: the environment variable {pcfg.api_key_env} is not "
            f"set (export {pcfg.api_key_env}=<your key>, or point provider.api_key_env at the variable that "
            "holds it)"
        )
    if pcfg.name == "local" and not pcfg.base_url:
        raise ProviderConfigError("provider 'local' needs provider.base_url (e.g. http://127.0.0.1:8000/v1)")


def build_provider(
    cfg: ProviderConfig | DictConfig | dict[str, Any],
    *,
    base_url: str | None = None,
    api_key: str | None = None,
) -> BaseProvider:
    """A provider on an explicit endpoint (``open_provider`` resolves it from config and environment)."""
    pcfg = as_provider_config(cfg)
    builder = _BUILDERS.get(pcfg.protocol)
    if builder is None:
        raise ProviderConfigError(f"provider '{pcfg.name}': unknown protocol '{pcfg.protocol}'")
    return builder(pcfg, Endpoint(base_url or pcfg.base_url, api_key or DUMMY_KEY))


@asynccontextmanager
async def open_provider(cfg: ProviderConfig | DictConfig | dict[str, Any]) -> AsyncIterator[Provider]:
    """The configured provider, open for the lifetime of the context (and the emulator with it, if
    scripted)."""
    pcfg = as_provider_config(cfg)
    check_provider_config(pcfg)
    custom = _CUSTOM.get(pcfg.protocol)
    if custom is not None:
        provider = await custom(pcfg)
        try:
            yield provider
        finally:
            await provider.aclose()
        return

    emulator = None
    base_url: str | None
    api_key: str | None
    if pcfg.emulator_script:
        from flowllm.emulator import Emulator

        emulator = Emulator(resolve_script(pcfg.emulator_script))
        await asyncio.to_thread(emulator.start)
        base_url = emulator.base_url if pcfg.protocol == "anthropic" else emulator.openai_base_url
        api_key = DUMMY_KEY
    else:
        base_url = pcfg.base_url
        api_key = os.environ.get(str(pcfg.api_key_env)) if pcfg.api_key_env else None
    try:
        built = build_provider(pcfg, base_url=base_url, api_key=api_key or DUMMY_KEY)
        try:
            yield built
        finally:
            await built.aclose()
    finally:
        if emulator is not None:
            await asyncio.to_thread(emulator.stop)


# The replay provider (provider=replay) serves a saved run's replies; it registers like any custom protocol.
from flowllm.providers.replay import open_replay  # noqa: E402

register_protocol("replay", open_replay)
