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
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from flowllm.agent.loop import Agent, AgentSettings
from flowllm.agent.subagents import SubAgentSpec
from flowllm.agent.turn import AGENT_TURN
from flowllm.config.schema import ProviderConfig, register_configs
from flowllm.datasets.gaia import load_tasks
from flowllm.engine import Recorder, build_pipeline, make_runner
from flowllm.engine.recorder import Redactor, atomic_write
from flowllm.errors import ConfigError, FlowError
from flowllm.experiment.pricing import PriceTable
from flowllm.experiment.progress import ProgressReporter
from flowllm.experiment.replay_audit import ReplayAudit
from flowllm.experiment.report import print_summary
from flowllm.experiment.runner import Experiment, ExperimentSettings, RunResult, load_outcomes, summarize
from flowllm.experiment.sweep import build_sweep_summary
from flowllm.providers import UsageLedger, check_provider_config, open_provider, provider_secrets
from flowllm.providers.replay import REPLAY_PROTOCOL, ReplayProvider, resolve_run_dir, source_provider_config
from flowllm.rundir.layout import RunLayout
from flowllm.tools import open_tool_pool

log = logging.getLogger("flowllm")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
register_configs()
# ${flowllm_abspath:...}: launchers that run elsewhere (Ray) need absolute folders; hydra.sweep.dir is relative.
OmegaConf.register_new_resolver("flowllm_abspath", lambda p: str(Path(str(p)).resolve()), replace=True)


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
    if cfg.experiment.attempts < 1:
        raise ConfigError(f"experiment.attempts must be at least 1, not {cfg.experiment.attempts}")
    source = f"conf/pipeline/{_choice('pipeline', cfg)}.yaml"
    pipeline = build_pipeline(cfg.pipeline.nodes, source=source, contract=AGENT_TURN)
    runner = make_runner(cfg.runner.name, cfg.runner.item_timeout_s, cfg.runner.turn_timeout_s)
    runner.validate(pipeline)
    provider_cfg = cast(ProviderConfig, OmegaConf.to_object(cfg.provider))
    if provider_cfg.emulator_script:
        script = resolve_path(provider_cfg.emulator_script, "provider.emulator_script")
        if not script.is_file():
            raise ConfigError(f"provider.emulator_script '{script}' does not exist")
        provider_cfg.emulator_script = str(script)
    check_provider_config(provider_cfg)
    tasks = load_tasks(
        resolve_path(cfg.dataset.path, "dataset.path"),
        limit=cfg.dataset.limit,
        levels=cfg.dataset.levels,
        task_ids=cfg.dataset.task_ids,
        fmt=cfg.dataset.format,
    )
    prices = PriceTable.load(resolve_path(cfg.experiment.pricing, "experiment.pricing"))
    settings = AgentSettings(
        max_turns=cfg.agent.max_turns,
        system_prompt=cfg.agent.system_prompt,
        summary_prompt=cfg.agent.summary_prompt,
    )
    if settings.max_turns < 1:
        raise ConfigError(f"agent.max_turns must be at least 1, not {settings.max_turns}")
    return {
        "pipeline": pipeline,
        "runner": runner,
        "provider_cfg": provider_cfg,
        "tasks": tasks,
        "settings": settings,
        "prices": prices,
        "subagents": subagent_specs(cfg),
    }


def priced_model(provider_cfg: ProviderConfig) -> str:
    """The model whose prices apply: a replay's is the replayed run's model."""
    if provider_cfg.protocol == REPLAY_PROTOCOL and provider_cfg.run_dir:
        return source_provider_config(resolve_run_dir(provider_cfg.run_dir))[0].model
    return provider_cfg.model


def subagent_specs(cfg: DictConfig) -> dict[str, SubAgentSpec]:
    """``subagents.<name>`` configs as the agent loop's specs."""
    specs: dict[str, SubAgentSpec] = {}
    for name, sub in (cfg.get("subagents") or {}).items():
        specs[str(name)] = SubAgentSpec(
            name=str(name),
            description=sub.description,
            system_prompt=sub.system_prompt,
            max_turns=sub.max_turns,
            servers=tuple(sub.servers) if sub.servers is not None else None,
            timeout_s=sub.timeout_s,
        )
    return specs


def build_experiment(
    cfg: DictConfig,
    parts: dict[str, Any],
    provider: Any,
    recorder: Recorder,
    *,
    progress: ProgressReporter | None = None,
    open_tools: Callable[..., Any] = open_tool_pool,
) -> Experiment:
    """The agent and the experiment of a prepared run (``prepare``), on an open provider.

    One place for the wiring, so that what the benchmarks measure is what ``python -m flowllm`` runs.
    """
    # Under provider=replay every node is compared with the saved run's, so the summary can tell exact
    # replays from diverged ones (flowllm/experiment/replay_audit.py).
    audit = (
        ReplayAudit(RunLayout(provider.run_dir), recorder.redactor.dumps, recorder)
        if isinstance(provider, ReplayProvider)
        else None
    )
    agent = Agent(
        parts["pipeline"],
        parts["runner"],
        parts["settings"],
        observer=audit if audit is not None else recorder,
        subagents=parts["subagents"],
    )
    return Experiment(
        agent=agent,
        provider=provider,
        tools_cfg=cfg.tools,
        recorder=recorder,
        settings=ExperimentSettings(
            max_concurrent=cfg.experiment.max_concurrent,
            task_timeout_s=cfg.experiment.task_timeout_s,
            resume=cfg.experiment.resume,
            attempts=cfg.experiment.attempts,
        ),
        progress=progress,
        open_tools=open_tools,
        audit=audit,
    )


async def _run_async(cfg: DictConfig, parts: dict[str, Any], recorder: Recorder, ledger: UsageLedger) -> RunResult:
    progress = ProgressReporter(enabled=bool(cfg.progress))
    async with open_provider(parts["provider_cfg"], ledger=ledger) as provider:
        experiment = build_experiment(cfg, parts, provider, recorder, progress=progress)
        return await experiment.run(parts["tasks"])


def _completed_before(run_dir: Path, tasks: list[Any], resume: bool) -> int:
    if not resume:
        return 0
    return sum(1 for o in load_outcomes(run_dir, tasks) if o.status == "completed")


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run the configured experiment into ``run_dir``; returns the summary."""
    from flowllm.experiment import workers

    if cfg.experiment.get("worker_shard"):  # one of the processes of experiment.workers=N
        return workers.run_shard(cfg, run_dir)
    if workers.resolve_workers(cfg.experiment.get("workers", 1)) > 1:
        return workers.run_parallel(cfg, run_dir, workers.resolve_workers(cfg.experiment.workers))
    parts = prepare(cfg)
    tasks = parts["tasks"]
    started = time.perf_counter()
    resumed = _completed_before(run_dir, tasks, cfg.experiment.resume)
    # Every key the run may send (pools, fallbacks) is masked wherever it would appear in an artifact.
    recorder = Recorder(run_dir, snapshot=cfg.recorder.snapshot, secrets=provider_secrets(parts["provider_cfg"]))
    # One line per attempt, appended across resumed sessions: what was really spent, failures included.
    ledger = UsageLedger(run_dir / "usage.jsonl", prices=parts["prices"], user=cfg.experiment.get("user"))
    try:
        result = asyncio.run(_run_async(cfg, parts, recorder, ledger))
    except KeyboardInterrupt:
        # A second Ctrl-C, or one before the loop could cancel cleanly: what finished is on disk.
        result = None
    finally:
        recorder.close()
        ledger.close()
    if result is None:
        result = RunResult(load_outcomes(run_dir, tasks), interrupted=True, resumed=resumed)
    summary = summarize(
        result.outcomes,
        total=len(tasks),
        wall_seconds=time.perf_counter() - started,
        interrupted=result.interrupted,
        resumed=result.resumed,
        model=priced_model(parts["provider_cfg"]),
        prices=parts["prices"],
        attempts=cfg.experiment.attempts,
    )
    summary["status"] = "interrupted" if result.interrupted else "finished"
    summary["experiment"] = cfg.experiment.name
    summary["provider"] = cfg.provider.name
    summary["model"] = cfg.provider.model
    summary["runner"] = cfg.runner.name
    summary["repair"] = cfg.repair.name
    summary["dataset"] = str(cfg.dataset.path)
    # Calls per provider, retries, fallbacks, breaker events and the billed tokens of every attempt (failed
    # tasks included, unlike `usage`, which counts the tasks' recorded results), from the whole ledger.
    summary["providers"] = UsageLedger.read(run_dir / "usage.jsonl").summary()
    atomic_write(run_dir / "summary.json", recorder.redactor.dumps(summary))
    print_summary(summary, result.outcomes, run_dir)
    return summary


def _job_error(cfg: DictConfig, run_dir: Path, message: str) -> dict[str, Any]:
    """A multirun job that could not run: its folder says why, and the sweep summary shows the row."""
    status = {"status": "error", "error": message}
    secrets = key_values(OmegaConf.select(cfg, "provider.api_key_env", default=None))
    atomic_write(run_dir / "summary.json", Redactor(secrets).dumps(status))
    return status


def _refresh_sweep(hydra_cfg: Any) -> None:
    try:
        build_sweep_summary(Path(str(hydra_cfg.sweep.dir)))
    except Exception as exc:  # the job's own results are saved; the comparison can be rebuilt later
        log.warning("flowllm: could not refresh the sweep summary: %s", exc)


@hydra.main(version_base="1.3", config_path=str(PROJECT_ROOT / "conf"), config_name="config")
def app(cfg: DictConfig) -> dict[str, Any]:
    # One line per HTTP request or MCP message drowns the progress bar; our own warnings still show.
    for noisy in ("httpx2", "httpx", "httpcore2", "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        summary = run(cfg, run_dir)
    except FlowError as exc:
        message = f"flowllm: error: {exc}"
        print(message, file=sys.stderr)
        if not multirun:
            sys.exit(2)
        # A raising job would stop Hydra from calling on_multirun_end: report and move on.
        status = _job_error(cfg, run_dir, str(exc))
        _refresh_sweep(hydra_cfg)
        return status
    except Exception as exc:
        if not multirun:
            raise  # a traceback means a bug in flowllm: show it
        traceback.print_exc()
        status = _job_error(cfg, run_dir, f"{type(exc).__name__}: {exc}")
        _refresh_sweep(hydra_cfg)
        return status
    if multirun:
        _refresh_sweep(hydra_cfg)
        return {"status": summary["status"], "accuracy": summary["accuracy"], "cost_usd": summary["cost_usd"]}
    if summary["interrupted"]:
        sys.exit(130)  # the shell's code for Ctrl-C; the summary and finished results are saved
    return summary


def main() -> None:
    # Ray (hydra/launcher=ray) reads these when it starts a local instance: no usage reporting, no token
    # authentication between the processes of one machine. A user who needs either sets the variable.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    app()
