"""Settings and places checked before the first task, each failure one line (``ConfigError``, exit 2).

* Timeouts: a negative or zero ``experiment.task_timeout_s`` or runner timeout would fail every task at once
  (or, as NaN, never time out); they are refused with the setting's name.
* The run directory: Hydra makes it before flowllm's code runs, so a read-only or unwritable place surfaced as
  Hydra's traceback. ``RunDirCheck`` is a Hydra callback that tries the folder first (``on_run_start``, and
  the sweep folder on ``on_multirun_start``) and raises a ``ConfigError`` (carried past Hydra's callback runner,
  which would only warn), which the command line says in one line, exit 2.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from flowllm.errors import CarriedError, ConfigError
from flowllm.nodes.cache import check_breakpoints

TIMEOUT_SETTINGS = (
    "experiment.task_timeout_s",
    "runner.item_timeout_s",
    "runner.fanout_timeout_s",
    "runner.turn_timeout_s",  # the deprecated name of fanout_timeout_s
)


def check_timeouts(cfg: DictConfig) -> None:
    """Refuse timeouts that are not a positive number of seconds."""
    for key in TIMEOUT_SETTINGS:
        value = OmegaConf.select(cfg, key, default=None)
        if value is None:
            continue
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be a positive number of seconds, not {value!r}") from None
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ConfigError(f"{key} must be a positive number of seconds, not {value}")


def check_cache(cfg: DictConfig) -> None:
    """The breakpoint count Anthropic accepts (else a ConfigError naming the allowed values; the TTL is
    checked with the provider, providers/factory.py), and one warning when the context policy rewrites the
    cached prefix on every turn."""
    check_breakpoints(OmegaConf.select(cfg, "provider.cache.breakpoints", default=4))
    keep = OmegaConf.select(cfg, "agent.keep_tool_result", default=-1)
    block = OmegaConf.select(cfg, "agent.trim_block", default=1)
    if OmegaConf.select(cfg, "provider.cache.enabled", default=False) and keep is not None and keep >= 0 and block == 1:
        logging.getLogger("flowllm").warning(
            "flowllm: agent.keep_tool_result=%s blanks one more tool result on every turn, so the prompt's cached "
            "prefix is rewritten instead of read each turn; agent.trim_block=%s would trim that many at a time",
            keep,
            max(keep, 5),
        )


def unwritable_reason(folder: Path) -> str | None:
    """Why ``folder`` cannot hold a run, or None when a file can be written there.

    Nothing is created: the probe goes to the folder or, when it does not exist yet, to its nearest existing
    parent (the folder's name may hold ``${now:...}``, which Hydra resolves again a moment later).
    """
    probe = folder
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        if not probe.is_dir():
            return f"'{probe}' is not a folder"
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".flowllm-write-check-"):
            pass
    except OSError as exc:
        return f"{exc.strerror or exc} ('{probe}')"
    return None


def check_run_dir(folder: Path | str, setting: str = "hydra.run.dir") -> None:
    reason = unwritable_reason(Path(folder))
    if reason is not None:
        raise ConfigError(
            f"the run directory {folder} cannot be written: {reason}; choose another with {setting}=<folder>"
        )


class RunDirCheck(Callback):
    """Stops a run whose folder cannot be written, with one line, before Hydra tries to write there."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir")

    @staticmethod
    def _check(config: DictConfig, key: str) -> None:
        folder = OmegaConf.select(config, key, default=None)
        if folder is None:
            return
        try:
            check_run_dir(Path(os.path.abspath(str(folder))), key)
        except ConfigError as exc:  # Hydra would warn about an Exception and go on: carried to the command line
            raise CarriedError(exc) from None
