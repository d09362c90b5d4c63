"""A run folder's ``.hydra/`` record (config.yaml, hydra.yaml, overrides.yaml), written by flowllm.

Hydra would write these files before the job function runs (``hydra.output_subdir``), so a rerun that the
folder then refuses (other settings, ``FingerprintMismatch``) would already have replaced the saved run's config
with the refused one's: a later replay of the folder would read settings that never ran there. flowllm turns
Hydra's writing off (``hydra.output_subdir: null`` in conf/config.yaml) and writes the same three files once the
folder has accepted the run (flowllm.setup.fingerprint.guard). Folders Hydra wrote are read the same way.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from flowllm.engine.recorder import atomic_write
from flowllm.rundir.layout import RunLayout


def write_config_record(cfg: DictConfig, run_dir: Path) -> None:
    """Write ``cfg`` (the job's composed config) and this Hydra job's settings and overrides into ``run_dir``'s
    ``.hydra/``, as Hydra writes them; nothing when not run by Hydra (as in tests calling the app directly)."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.instance().cfg
    if hydra_cfg is None:
        return
    layout = RunLayout(Path(run_dir))
    atomic_write(layout.config, OmegaConf.to_yaml(cfg).encode())
    atomic_write(layout.hydra, OmegaConf.to_yaml(hydra_cfg).encode())
    atomic_write(layout.overrides, OmegaConf.to_yaml(HydraConfig.get().overrides.task).encode())


def has_config_record(run_dir: Path) -> bool:
    """Whether the folder already holds a run's ``.hydra/`` record (flowllm's or Hydra's)."""
    return RunLayout(Path(run_dir)).overrides.is_file()
