"""Provider configs read where the config is loaded: a node of the composed config typed as ``ProviderConfig``,
and a provider config found by name (a fallback, alias target, agent model, judge, vision or fork's live provider).

A name is read the way Hydra composes ``provider=<name>``: through Hydra's compose API when the app runs under
Hydra (so ``--config-dir`` additions are found), else from ``provider.config_dir`` or the project's
``conf/provider`` with the same ``defaults`` handling (``base_provider``, another provider file, ``_self_``).
``NameResolver`` remembers every name it resolved: the run's set-up resolves each once and hands the providers
that table (``flowllm.providers.registry.ProviderTable``), so nothing below the set-up reads a config file.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from flowllm.config.provider_schema import ProviderConfig
from flowllm.errors import ConfigError
from flowllm.resources import PROVIDER_CONFIG_DIR

ProviderLoader = Callable[[str], ProviderConfig]

__all__ = ["FileResolver", "HydraResolver", "NameResolver", "ProviderLoader", "default_resolver", "provider_config"]


def provider_config(cfg: ProviderConfig | DictConfig | Mapping[str, Any]) -> ProviderConfig:
    """The typed ``ProviderConfig`` of a dataclass, a (structured or plain) DictConfig, or a dict."""
    if isinstance(cfg, ProviderConfig):
        return cfg
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ProviderConfig), cfg)
        obj = OmegaConf.to_object(merged)
    except Exception as exc:  # omegaconf raises several error types; all mean "this config is wrong"
        raise ConfigError(f"invalid provider config: {exc}".splitlines()[0]) from exc
    assert isinstance(obj, ProviderConfig)
    return obj


class FileResolver:
    """Provider configs from YAML files in one folder, composed like Hydra's ``provider=<name>`` does."""

    def __init__(self, folder: Path | str = PROVIDER_CONFIG_DIR) -> None:
        self.folder = Path(folder)

    def known(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.yaml"))

    def _load(self, name: str, stack: tuple[str, ...]) -> DictConfig:
        path = self.folder / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(
                f"unknown provider '{name}' (no {name}.yaml in {self.folder}; known: {', '.join(self.known())})"
            )
        if name in stack:
            raise ConfigError(f"provider config defaults loop: {' -> '.join((*stack, name))}")
        data = OmegaConf.load(path)
        assert isinstance(data, DictConfig)
        defaults = list(data.pop("defaults", None) or ["_self_"])
        if "_self_" not in defaults:
            defaults.append("_self_")
        merged: Any = OmegaConf.create({})
        for entry in defaults:
            if entry == "_self_":
                merged = OmegaConf.merge(merged, data)
            elif entry == "base_provider":
                continue  # the schema itself, applied when the result is typed
            elif isinstance(entry, str):
                merged = OmegaConf.merge(merged, self._load(entry, (*stack, name)))
            else:
                raise ConfigError(f"{path}: unsupported defaults entry {entry!r}")
        assert isinstance(merged, DictConfig)
        return merged

    def __call__(self, name: str) -> ProviderConfig:
        return provider_config(self._load(name, ()))


class HydraResolver:
    """``provider=<name>`` composed by the running Hydra app (its search path, its structured schema)."""

    def __init__(self, fallback: FileResolver) -> None:
        self.fallback = fallback

    def __call__(self, name: str) -> ProviderConfig:
        from hydra import compose
        from hydra.errors import MissingConfigException

        try:
            composed = compose(config_name=None, overrides=[f"+provider={name}"])
        except MissingConfigException:
            return self.fallback(name)  # the file resolver's error lists the known names
        return provider_config(composed.provider)


def default_resolver(cfg: ProviderConfig) -> ProviderLoader:
    """Where the names of ``cfg`` are read: its ``config_dir``, else the running Hydra app, else conf/provider."""
    if cfg.config_dir:
        return FileResolver(cfg.config_dir)
    files = FileResolver()
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return HydraResolver(files)
    return files


class NameResolver:
    """A loader that reads each name once and remembers it: ``resolved`` is every provider config the run named."""

    def __init__(self, load: ProviderLoader) -> None:
        self.load = load
        self.resolved: dict[str, ProviderConfig] = {}

    def __call__(self, name: str) -> ProviderConfig:
        if name not in self.resolved:
            self.resolved[name] = self.load(name)
        return copy.deepcopy(self.resolved[name])  # the planner adjusts what it is given (model, tool_protocol)
