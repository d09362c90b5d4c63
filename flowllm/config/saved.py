"""A saved run's composed config (``.hydra/config.yaml``) read back as plain data: what a replay, a fork or a
re-judge learns of the run it repeats (its provider, its turn graph's nodes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from flowllm.errors import ConfigError

__all__ = ["saved_section"]


def saved_section(config_path: Path, key: str, *, resolve: bool = True) -> Any:
    """The section ``key`` (dotted) of a saved config as plain dicts and lists, None when the config has none;
    with ``resolve`` its interpolations resolved against that config. Raises ConfigError when it cannot be read."""
    try:
        node = OmegaConf.select(OmegaConf.load(config_path), key)
        return OmegaConf.to_container(node, resolve=resolve) if OmegaConf.is_config(node) else node
    except Exception as exc:  # omegaconf and yaml raise many types; all mean "unreadable config"
        raise ConfigError(f"cannot read {config_path}: {str(exc).splitlines()[0]}") from exc


def saved_cwd(hydra_file: Path) -> Path | None:
    """The folder a saved run was started in (Hydra's ``runtime.cwd``, in its ``.hydra/hydra.yaml``), where its
    relative paths are; None when it is not recorded or cannot be read."""
    try:
        found = saved_section(hydra_file, "hydra.runtime.cwd", resolve=False) if hydra_file.is_file() else None
    except ConfigError:
        return None
    return Path(found) if isinstance(found, str) and found else None
