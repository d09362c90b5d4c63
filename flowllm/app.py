"""The Hydra application behind ``python -m flowllm``.

Everything a user can get wrong (config, dataset, keys, pipeline) is checked before the first task starts and
reported as one line on stderr with a non-zero exit; a traceback means a bug in flowllm.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from flowllm.agent.loop import Agent, AgentSettings
from flowllm.benchmarks.gaia import load_tasks
from flowllm.config.schema import register_configs
from flowllm.engine import FlowError, Recorder, build_pipeline, make_runner
from flowllm.engine.recorder import atomic_write
from flowllm.experiment.progress import ProgressReporter
from flowllm.experiment.report import print_summary
from flowllm.experiment.runner import Experiment, ExperimentSettings, summarize
from flowllm.providers import ProviderConfigError, check_provider_config, open_provider

log = logging.getLogger("flowllm")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
register_configs()


class ConfigError(FlowError):
    """A setting is invalid; the message names it."""


def resolve_path(value: str, setting: str) -> Path:
    """A relative path is looked up from the working directory, then from the project folder."""
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return path
    candidate = PROJECT_ROOT / path
    return candidate if candidate.exists() else path


def key_values(api_key_env: str | None) -> list[str]:
    """The secret values the recorder must mask (every variable of a comma list)."""
    if not api_key_env:
        return []
    names = [n.strip() for n in str(api_key_env).split(",") if n.strip()]
    return [os.environ[n] for n in names if os.environ.get(n)]


def _choice(group: str, cfg: DictConfig) -> str:
    try:
        return str(HydraConfig.get().runtime.choices.get(group) or cfg[group].get("name"))
    except ValueError:  # not running under Hydra (tests that call run() directly)
        return str(cfg[group].get("name"))


def prepare(cfg: DictConfig) -> dict[str, Any]:
    """Validate everything and build what the run needs; raises FlowError (or ValueError) on bad input."""
    if cfg.recorder.snapshot not in ("all", "errors", "none"):
        raise ConfigError(f"recorder.snapshot must be all, errors or none, not '{cfg.recorder.snapshot}'")
    if cfg.experiment.max_concurrent < 1:
        raise ConfigError("experiment.max_concurrent must be at least 1")
    source = f"conf/pipeline/{_choice('pipeline', cfg)}.yaml"
    pipeline = build_pipeline(cfg.pipeline.nodes, source=source)
    runner = make_runner(cfg.runner.name, cfg.runner.item_timeout_s, cfg.runner.turn_timeout_s)
    runner.validate(pipeline)
    provider_cfg = OmegaConf.to_object(cfg.provider)
    if provider_cfg.emulator_script:  # type: ignore[attr-defined]
        script = resolve_path(provider_cfg.emulator_script, "provider.emulator_script")  # type: ignore[attr-defined]
        if not script.is_file():
            raise ConfigError(f"provider.emulator_script '{script}' does not exist")
        provider_cfg.emulator_script = str(script)  # type: ignore[attr-defined]
    check_provider_config(provider_cfg)
    tasks = load_tasks(
        resolve_path(cfg.dataset.path, "dataset.path"),
        limit=cfg.dataset.limit,
        levels=cfg.dataset.levels,
        task_ids=cfg.dataset.task_ids,
    )
    settings = AgentSettings(
        max_turns=cfg.agent.max_turns,
        system_prompt=cfg.agent.system_prompt,
        summary_prompt=cfg.agent.summary_prompt,
    )
    if settings.max_turns < 1:
        raise ConfigError(f"agent.max_turns must be at least 1, not {settings.max_turns}")
    return {"pipeline": pipeline, "runner": runner, "provider_cfg": provider_cfg, "tasks": tasks, "settings": settings}


async def _run_async(cfg: DictConfig, parts: dict[str, Any], recorder: Recorder) -> tuple[list[Any], bool]:
    agent = Agent(parts["pipeline"], parts["runner"], parts["settings"], observer=recorder)
    progress = ProgressReporter(enabled=bool(cfg.progress))
    async with open_provider(parts["provider_cfg"]) as provider:
        experiment = Experiment(
            agent=agent,
            provider=provider,
            tools_cfg=cfg.tools,
            recorder=recorder,
            settings=ExperimentSettings(
                max_concurrent=cfg.experiment.max_concurrent,
                task_timeout_s=cfg.experiment.task_timeout_s,
            ),
            progress=progress,
        )
        return await experiment.run(parts["tasks"])


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run the configured experiment into ``run_dir``; returns the summary."""
    parts = prepare(cfg)
    started = time.perf_counter()
    recorder = Recorder(run_dir, snapshot=cfg.recorder.snapshot, secrets=key_values(cfg.provider.api_key_env))
    try:
        outcomes, interrupted = asyncio.run(_run_async(cfg, parts, recorder))
    except KeyboardInterrupt:
        outcomes, interrupted = [], True
    finally:
        recorder.close()
    summary = summarize(
        outcomes, total=len(parts["tasks"]), wall_seconds=time.perf_counter() - started, interrupted=interrupted
    )
    summary["experiment"] = cfg.experiment.name
    summary["provider"] = cfg.provider.name
    summary["model"] = cfg.provider.model
    summary["runner"] = cfg.runner.name
    summary["repair"] = cfg.repair.name
    atomic_write(run_dir / "summary.json", recorder.redactor.dumps(summary))
    print_summary(summary, outcomes, run_dir)
    return summary


@hydra.main(version_base="1.3", config_path=str(PROJECT_ROOT / "conf"), config_name="config")
def app(cfg: DictConfig) -> dict[str, Any]:
    # One line per HTTP request or MCP message drowns the progress bar; our own warnings still show.
    for noisy in ("httpx2", "httpx", "httpcore2", "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        return run(cfg, run_dir)
    except (FlowError, ProviderConfigError) as exc:
        message = f"flowllm: error: {exc}"
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            # A raising job would stop Hydra from calling on_multirun_end: report and move on.
            print(message, file=sys.stderr)
            return {"status": "error", "error": str(exc)}
        print(message, file=sys.stderr)
        sys.exit(2)


def main() -> None:
    app()
