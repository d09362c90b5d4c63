"""The run's side of ``tool-vision`` (flowllm/agent/vision.py): which provider looks at images, checked before the
first task, and opened for the run beside the main provider.

``tools.vision.provider`` names a conf/provider config (optionally ``<name>:<model>``), resolved like a fallback;
unset, the run's own provider looks. A provider that takes no images (``accepts`` without ``image``) cannot:
named explicitly, that is a config error; as the run's own, the tool is not offered, with one warning and an
entry in ``summary.json`` → ``tools.unavailable``. Under ``provider=replay`` the replay serves the saved vision
calls whatever the setting names.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig

from flowllm.agent.vision import DEFAULT_SYSTEM_PROMPT, VISION_SERVER, VisionSpec
from flowllm.config.provider_schema import ProviderConfig
from flowllm.errors import ConfigError
from flowllm.providers import UsageLedger, check_provider_config, open_provider
from flowllm.providers.registry import Resolver, RouteSpec
from flowllm.providers.replay import REPLAY_PROTOCOL

log = logging.getLogger("flowllm")


@dataclass(frozen=True)
class VisionPlan:
    """``tools.vision`` checked: the tool's settings and the provider that looks (None: the run's)."""

    provider_cfg: ProviderConfig | None
    system_prompt: str
    max_image_bytes: int
    timeout_s: float
    unavailable: str | None = None  # why the tool is not offered in this run

    @property
    def offered(self) -> bool:
        return self.unavailable is None


def _takes_images(cfg: ProviderConfig) -> bool:
    return "image" in cfg.accepts and cfg.content_format != "string"


def plan_vision(tools: DictConfig, run_provider: ProviderConfig, resolve: Resolver) -> VisionPlan | None:
    """The vision tool of this run, or None when ``tools.vision.enabled`` is off; ``resolve`` reads the provider
    ``tools.vision.provider`` names."""
    vision = tools.get("vision")
    if vision is None or not vision.enabled:
        return None
    if not vision.max_image_mb > 0:
        raise ConfigError(f"tools.vision.max_image_mb must be a positive number, not {vision.max_image_mb}")
    if not vision.timeout_s > 0:
        raise ConfigError(f"tools.vision.timeout_s must be a positive number of seconds, not {vision.timeout_s}")
    settings: dict[str, Any] = {
        "system_prompt": str(vision.system_prompt or "").strip() or DEFAULT_SYSTEM_PROMPT,
        "max_image_bytes": int(float(vision.max_image_mb) * 1024 * 1024),
        "timeout_s": float(vision.timeout_s),
    }
    if run_provider.protocol == REPLAY_PROTOCOL:  # the replay serves the saved vision calls
        return VisionPlan(provider_cfg=None, **settings)
    if vision.provider:
        spec = RouteSpec.parse(str(vision.provider))
        if not spec.provider:
            raise ConfigError(f"tools.vision.provider '{vision.provider}' names no provider config")
        cfg = resolve(spec.provider)
        if spec.model:
            cfg = replace(cfg, model=spec.model)
        if vision.get("emulator_script"):
            from flowllm.providers.factory import resolve_script

            cfg = replace(cfg, emulator_script=str(resolve_script(str(vision.emulator_script))))
        if not _takes_images(cfg):
            raise ConfigError(
                f"tools.vision.provider '{vision.provider}' takes no images (accepts: {list(cfg.accepts)}): "
                "name a provider whose config accepts image"
            )
        check_provider_config(cfg, resolve=resolve)
        return VisionPlan(provider_cfg=cfg, **settings)
    if not _takes_images(run_provider):
        reason = (
            f"provider '{run_provider.name}' takes no images (accepts: {list(run_provider.accepts)}); "
            "set tools.vision.provider to one that does (e.g. tools.vision.provider=claude)"
        )
        return VisionPlan(provider_cfg=None, unavailable=reason, **settings)
    return VisionPlan(provider_cfg=None, **settings)


@asynccontextmanager
async def open_vision(
    plan: VisionPlan | None,
    *,
    ledger: UsageLedger | None,
    cache_env: dict[str, str],
    fixtures_url: str | None,
    resolve: Resolver | None = None,
) -> AsyncIterator[VisionSpec | None]:
    """The open vision tool for the run (its own provider open while the run lasts, ``resolve`` giving the configs
    its fallbacks name), or None when not offered."""
    if plan is None:
        yield None
        return
    if not plan.offered:
        log.warning("flowllm: %s is not offered: %s", VISION_SERVER, plan.unavailable)
        yield None
        return
    from flowllm.tools.browse import UrlPolicy
    from flowllm.tools.web.cache import WebCache

    spec = VisionSpec(
        system_prompt=plan.system_prompt,
        max_image_bytes=plan.max_image_bytes,
        timeout_s=plan.timeout_s,
        url_policy=UrlPolicy(fixtures_url),
        cache=WebCache.from_environment(cache_env),
    )
    if plan.provider_cfg is None:
        yield spec
        return
    async with open_provider(plan.provider_cfg, ledger=ledger, resolve=resolve) as provider:
        yield replace(spec, provider=provider)


def unavailable_tools(plan: VisionPlan | None) -> dict[str, str]:
    """``tools.unavailable`` entries of the vision tool (summary.json)."""
    if plan is None or plan.offered:
        return {}
    return {VISION_SERVER: str(plan.unavailable)}
