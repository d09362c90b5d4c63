"""The run's own settings read from the composed config once, checked where they are read: the experiment's
(concurrency, attempts, epochs, timeouts) and the spending caps (``agent.limits``, ``experiment.budget``).

``prepare`` (setup/build.py) keeps what these return in the ``PreparedRun``; the experiment, the workers, the
progress line and the summary are handed them and never read the raw config for them again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from flowllm.config.schema import Reducer
from flowllm.core.coordination import Coordination, connect
from flowllm.errors import ConfigError
from flowllm.providers.adaptive.aimd import parse_auto
from flowllm.run.runner import ExperimentSettings
from flowllm.rundir.store import RunStore, is_store_url, open_store
from flowllm.setup import fingerprint
from flowllm.setup.checks import check_cache, check_timeouts
from flowllm.spend.spending import RunBudget, TaskLimits
from flowllm.telemetry.live import check_telemetry

__all__ = [
    "check_settings",
    "concurrency",
    "coordination_settings",
    "experiment_settings",
    "spending_settings",
    "store_settings",
    "telemetry_endpoint",
]


def _at_least_one(value: Any, setting: str) -> None:
    if value < 1:
        raise ConfigError(f"{setting} must be at least 1, not {value}")


def concurrency(value: Any) -> tuple[int, int | None]:
    """``experiment.max_concurrent``: (tasks at once, the ceiling of the adaptive calls in flight or None).
    ``auto`` / ``auto:N`` runs up to N tasks (default 64) and lets AIMD find the calls in flight
    (flowllm/providers/adaptive/aimd.py)."""
    try:
        ceiling = parse_auto(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if ceiling is not None:
        return ceiling, ceiling
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"experiment.max_concurrent must be a whole number, auto or auto:N, not {value!r}")
    _at_least_one(value, "experiment.max_concurrent")
    return value, None


def check_settings(cfg: DictConfig) -> None:
    """The run-wide numbers a user may get wrong, and the timeouts and telemetry settings."""
    concurrency(cfg.experiment.max_concurrent)
    _at_least_one(cfg.experiment.attempts, "experiment.attempts")
    _at_least_one(cfg.experiment.epochs, "experiment.epochs")
    _at_least_one(cfg.agent.max_turns, "agent.max_turns")
    if not cfg.experiment.progress_interval_s > 0:
        interval = cfg.experiment.progress_interval_s
        raise ConfigError(f"experiment.progress_interval_s must be a positive number of seconds, not {interval}")
    if not cfg.experiment.task_timeout_s > 0:  # also refuses NaN
        timeout = cfg.experiment.task_timeout_s
        raise ConfigError(f"experiment.task_timeout_s must be a positive number of seconds, not {timeout}")
    check_timeouts(cfg)
    check_cache(cfg)
    check_telemetry(telemetry_endpoint(cfg))


def telemetry_endpoint(cfg: DictConfig) -> str | None:
    """``telemetry.otlp_endpoint``, None when unset."""
    endpoint = OmegaConf.select(cfg, "telemetry.otlp_endpoint")
    return str(endpoint) if endpoint else None


def _section(cfg: DictConfig, key: str) -> dict[str, Any]:
    node = OmegaConf.select(cfg, key)
    data = OmegaConf.to_container(node) if node is not None else {}
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


def spending_settings(cfg: DictConfig) -> tuple[TaskLimits, RunBudget]:
    """``agent.limits`` and ``experiment.budget``, checked (ConfigError: one line, exit 2)."""
    return TaskLimits.from_config(_section(cfg, "agent.limits")), RunBudget.from_config(
        _section(cfg, "experiment.budget")
    )


def coordination_settings(cfg: DictConfig, dataset_path: Path) -> Coordination | None:
    """``experiment.coordination``: Redis, checked to answer (``ConfigError`` naming the URL when it does not);
    the run's keys are under ``?run=NAME`` of the URL, else the run's fingerprint (shards of a run share it)."""
    url = OmegaConf.select(cfg, "experiment.coordination")
    if not url:
        return None
    workers = cfg.experiment.get("workers", 1)
    if str(workers) != "1" or str(cfg.experiment.get("executor", "local")) != "local":
        raise ConfigError(
            "experiment.coordination works with experiment.workers=1 and executor=local: run more shards instead"
        )
    return connect(str(url), fingerprint.compute(cfg, dataset_path).digest[:16])


def experiment_settings(
    cfg: DictConfig, limits: TaskLimits, budget: RunBudget, coordination: Coordination | None = None
) -> ExperimentSettings:
    """The experiment's settings (``check_settings`` has checked the numbers)."""
    tasks, ceiling = concurrency(cfg.experiment.max_concurrent)
    return ExperimentSettings(
        max_concurrent=tasks,
        adaptive_ceiling=ceiling,
        task_timeout_s=float(cfg.experiment.task_timeout_s),
        resume=fingerprint.resume_mode(cfg.experiment.resume) is not fingerprint.ResumeMode.off,
        attempts=int(cfg.experiment.attempts),
        epochs=int(cfg.experiment.epochs),
        epoch_reducer=Reducer(cfg.experiment.epoch_reducer),
        limits=limits,
        budget=budget,
        coordination=coordination,
    )


def store_settings(cfg: DictConfig) -> RunStore | None:
    """``experiment.store``: the object store the run is kept in as well, checked to accept a write before
    anything runs (``ConfigError`` naming the URL when it does not); None for unset or ``file://``."""
    url = OmegaConf.select(cfg, "experiment.store")
    if not is_store_url(url):
        return None
    return open_store(str(url))
