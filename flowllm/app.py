"""The Hydra application behind ``python -m flowllm``.

Everything a user can get wrong (config, dataset, keys, pipeline) is checked before the first task starts and
reported as one line on stderr with a non-zero exit; a traceback means a bug in flowllm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from flowllm.agent.loop import Agent, AgentSettings
from flowllm.agent.subagents import SubAgentSpec
from flowllm.agent.turn import AGENT_TURN
from flowllm.agent.vision import VisionSpec
from flowllm.config.check import refuse_ignored_overrides
from flowllm.config.schema import JudgeConfig, ProviderConfig, Reducer, register_configs
from flowllm.datasets.adapters import DatasetSpec, load_dataset
from flowllm.engine import Recorder, build_pipeline
from flowllm.engine.recorder import RecordError, Redactor, atomic_write
from flowllm.engine.runners import runner_from_config
from flowllm.errors import ConfigError, FlowError, RunStopped
from flowllm.exit_codes import ExitCode, error_exit_code, run_exit_code
from flowllm.experiment import fingerprint, provenance, workers
from flowllm.experiment.budget_report import batch_cost, budget_summary, spending_settings
from flowllm.experiment.checks import check_timeouts
from flowllm.experiment.fork_accounting import fork_summary
from flowllm.experiment.preflight import PreflightError, ProviderTarget, preflight
from flowllm.experiment.prepared import PreparedRun
from flowllm.experiment.pricing import PriceTable
from flowllm.experiment.progress import ProgressReporter
from flowllm.experiment.projection import Projector
from flowllm.experiment.replay_audit import ReplayAudit
from flowllm.experiment.report import print_summary, what_acted
from flowllm.experiment.run_stats import check_stats, run_stats, stats_settings
from flowllm.experiment.runner import Experiment, ExperimentSettings, RunResult, load_outcomes, summarize
from flowllm.experiment.spending import SpendBook, refuse_unpriced
from flowllm.experiment.sweep import build_sweep_summary
from flowllm.experiment.task_usage import read_bills
from flowllm.experiment.vision import open_vision, plan_vision, unavailable_tools
from flowllm.providers import UsageLedger, check_provider_config, open_provider, provider_secrets
from flowllm.providers.fork import ForkProvider, check_fork_pipeline
from flowllm.providers.replay import REPLAY_PROTOCOL, ReplayProvider, resolve_run_dir, source_provider_config
from flowllm.resources import bundled
from flowllm.rundir.layout import RunLayout
from flowllm.scoring import check_scorer, judge_provider_config, open_scorer
from flowllm.scoring.judge import judge_template
from flowllm.scoring.rejudge import inherit_replayed_run
from flowllm.scoring.report import scoring_summary
from flowllm.scoring.scorers import Scorer
from flowllm.telemetry.live import attach_telemetry, check_telemetry
from flowllm.tools import load_settings, open_tool_pool
from flowllm.tools.python import limits_from_args, probe_gaps
from flowllm.tools.sandbox import describe_gaps, protect_process
from flowllm.tools.webconf import cache_env, check_web_tools, web_tools

log = logging.getLogger("flowllm")

register_configs()
# ${flowllm_abspath:...}: launchers that run elsewhere (Ray) need absolute folders; hydra.sweep.dir is relative.
OmegaConf.register_new_resolver("flowllm_abspath", lambda p: str(Path(str(p)).resolve()), replace=True)


def resolve_path(value: str, setting: str) -> Path:
    """A relative path is looked up from the working directory, then among the bundled files (resources.py)."""
    return bundled(value)


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


class _Problems:
    """Collects the problems of independent checks, so that one run lists them all (flowllm/experiment/preflight)."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def check(self, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except PreflightError as exc:
            self.found.extend(exc.problems)
        except (FlowError, ValueError) as exc:
            self.found.append(str(exc))
        return None


def _check_settings(cfg: DictConfig) -> None:
    if cfg.experiment.max_concurrent < 1:
        raise ConfigError("experiment.max_concurrent must be at least 1")
    if cfg.experiment.attempts < 1:
        raise ConfigError(f"experiment.attempts must be at least 1, not {cfg.experiment.attempts}")
    if cfg.experiment.epochs < 1:
        raise ConfigError(f"experiment.epochs must be at least 1, not {cfg.experiment.epochs}")
    if cfg.agent.max_turns < 1:
        raise ConfigError(f"agent.max_turns must be at least 1, not {cfg.agent.max_turns}")
    if not cfg.experiment.progress_interval_s > 0:
        interval = cfg.experiment.progress_interval_s
        raise ConfigError(f"experiment.progress_interval_s must be a positive number of seconds, not {interval}")
    check_timeouts(cfg)
    check_telemetry(cfg)


def _pipeline(cfg: DictConfig) -> tuple[Any, Any]:
    source = f"conf/pipeline/{_choice('pipeline', cfg)}.yaml"
    pipeline = build_pipeline(cfg.pipeline.nodes, source=source, contract=AGENT_TURN)
    runner = runner_from_config(cfg.runner)
    runner.validate(pipeline)
    return pipeline, runner


def _provider(cfg: DictConfig) -> ProviderConfig:
    provider_cfg = cast(ProviderConfig, OmegaConf.to_object(cfg.provider))
    if provider_cfg.emulator_script:
        script = resolve_path(provider_cfg.emulator_script, "provider.emulator_script")
        if not script.is_file():
            raise ConfigError(f"provider.emulator_script '{script}' does not exist")
        provider_cfg.emulator_script = str(script)
    return provider_cfg


def _judge(cfg: DictConfig, provider_cfg: ProviderConfig) -> tuple[JudgeConfig, ProviderConfig | None]:
    """The scorer's judge: its settings, and its provider when the dataset is judged."""
    check_scorer(cfg.dataset.scorer)
    judge_cfg = cast(JudgeConfig, OmegaConf.to_object(cfg.judge))
    judge_provider: ProviderConfig | None = None
    if cfg.dataset.scorer == "judge":
        judge_template(judge_cfg.template)
        judge_provider = judge_provider_config(judge_cfg, provider_cfg)
        check_provider_config(judge_provider)
    return judge_cfg, judge_provider


def prepare(cfg: DictConfig) -> PreparedRun:
    """Validate everything and build what the run needs; raises PreflightError listing every problem found."""
    parts, _, problems = prepare_parts(cfg)
    if problems or parts is None:
        raise PreflightError(problems)
    return parts


def prepare_parts(cfg: DictConfig) -> tuple[PreparedRun | None, ProviderConfig | None, list[str]]:
    """The prepared run (None if anything is wrong), the provider config when it could be read, and every
    problem found on the way (so that a run lists them all at once)."""
    problems = _Problems()
    problems.check(lambda: _check_settings(cfg))
    pipeline_runner = problems.check(lambda: _pipeline(cfg))
    spend_caps = problems.check(lambda: spending_settings(cfg))  # agent.limits, experiment.budget
    provider_cfg = problems.check(lambda: _provider(cfg))
    if provider_cfg is not None:
        problems.check(lambda: check_provider_config(provider_cfg))
        if pipeline_runner is not None:  # a fork needs the saved run's nodes in this pipeline
            problems.check(lambda: check_fork_pipeline(provider_cfg, pipeline_runner[0]))
    problems.check(lambda: check_web_tools(cfg))
    # ToolConfigError: a server entry that cannot work, before anything starts.
    problems.check(lambda: load_settings(cfg.tools))
    tasks = problems.check(
        lambda: load_dataset(DatasetSpec.from_config(cfg.dataset, resolve_path(cfg.dataset.path, "dataset.path")))
    )
    if tasks is not None:
        problems.check(lambda: check_stats(cfg.stats, tasks))
    judge = problems.check(lambda: _judge(cfg, provider_cfg)) if provider_cfg is not None else None
    prices = problems.check(lambda: PriceTable.load(resolve_path(cfg.experiment.pricing, "experiment.pricing")))
    subagents = problems.check(lambda: subagent_specs(cfg))
    vision = problems.check(lambda: plan_vision(cfg.tools, provider_cfg)) if provider_cfg is not None else None
    if prices is not None and provider_cfg is not None and judge is not None and spend_caps is not None:
        models = [t.cfg.model for t in preflight_targets(provider_cfg)]
        models += [c.model for c in (judge[1], vision.provider_cfg if vision is not None else None) if c is not None]
        problems.check(lambda: refuse_unpriced(models, prices, *spend_caps))
    if problems.found:
        return None, provider_cfg, problems.found
    pipeline, runner = pipeline_runner
    assert judge is not None  # provider_cfg was built, or problems were found above
    judge_cfg, judge_provider = judge
    settings = AgentSettings(
        max_turns=cfg.agent.max_turns,
        system_prompt=cfg.agent.system_prompt,
        summary_prompt=cfg.agent.summary_prompt,
    )
    prepared = PreparedRun(
        pipeline=pipeline,
        runner=runner,
        provider_cfg=provider_cfg,
        tasks=tasks,
        settings=settings,
        prices=prices,
        subagents=subagents,
        judge_cfg=judge_cfg,
        judge_provider=judge_provider,
        vision=vision,
    )
    return prepared, provider_cfg, []


def preflight_targets(provider_cfg: ProviderConfig) -> list[ProviderTarget]:
    """The providers of the run: the main one and every fallback, alias and agent model it routes to."""
    try:
        plan = check_provider_config(provider_cfg)
    except FlowError:  # reported by prepare; the main provider can still be reached
        plan = None
    if plan is None:
        return [ProviderTarget(provider_cfg.name, provider_cfg)]
    members = [ProviderTarget(m.id, m.cfg) for m in plan.members.values()]
    return members or [ProviderTarget(provider_cfg.name, provider_cfg)]


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
    parts: PreparedRun,
    provider: Any,
    recorder: Recorder,
    *,
    progress: ProgressReporter | None = None,
    open_tools: Callable[..., Any] = open_tool_pool,
    scorer: Scorer | None = None,
    vision: VisionSpec | None = None,
) -> Experiment:
    """The agent and the experiment of a prepared run (``prepare``), on an open provider.

    One place for the wiring, so that what the benchmarks measure is what ``python -m flowllm`` runs.
    """
    # Under provider=replay every node is compared with the saved run's, so the summary can tell exact
    # replays from diverged ones (flowllm/experiment/replay_audit.py).
    audit = (
        ReplayAudit(
            RunLayout(provider.run_dir),
            recorder.redactor.dumps,
            recorder,
            forks=provider.forks if isinstance(provider, ForkProvider) else None,
        )
        if isinstance(provider, ReplayProvider)
        else None
    )
    agent = Agent(
        parts.pipeline,
        parts.runner,
        parts.settings,
        observer=audit if audit is not None else recorder,
        subagents=parts.subagents,
        vision=vision,
    )
    return Experiment(
        agent=agent,
        provider=provider,
        tools_cfg=cfg.tools,
        recorder=recorder,
        settings=ExperimentSettings(
            max_concurrent=cfg.experiment.max_concurrent,
            task_timeout_s=cfg.experiment.task_timeout_s,
            resume=fingerprint.resume_mode(cfg.experiment.resume) is not fingerprint.ResumeMode.off,
            attempts=cfg.experiment.attempts,
            epochs=cfg.experiment.epochs,
            epoch_reducer=Reducer(cfg.experiment.epoch_reducer),
            limits=spending_settings(cfg)[0],
            budget=spending_settings(cfg)[1],
        ),
        progress=progress,
        open_tools=open_tools,
        audit=audit,
        scorer=scorer,
        breakdown=list(cfg.dataset.breakdown or []),
        tools_unavailable=unavailable_tools(parts.vision),
    )


async def _run_async(
    cfg: DictConfig, parts: PreparedRun, recorder: Recorder, ledger: UsageLedger, fixtures_url: str | None
) -> RunResult:
    """The tasks, once the preflight passed; the web tool environment (``web_tools``) is up already."""
    projector = Projector(SpendBook(ledger.path), spending_settings(cfg)[1]) if ledger.path is not None else None
    progress = ProgressReporter(
        enabled=bool(cfg.progress),
        ledger=ledger,
        interval_s=float(cfg.experiment.progress_interval_s),
        projector=projector,
    )
    catalog = parts.tools_catalog
    scorer_ctx = open_scorer(
        cfg.dataset.scorer,
        judge=parts.judge_cfg,
        judge_provider=parts.judge_provider,
        run_dir=recorder.run_dir,
        redactor=recorder.redactor,
        prices=parts.prices,
    )
    async with (
        open_provider(parts.provider_cfg, ledger=ledger) as provider,
        open_vision(
            parts.vision, ledger=ledger, cache_env=cache_env(cfg, recorder.run_dir), fixtures_url=fixtures_url
        ) as vision,
        scorer_ctx as scorer,
    ):
        experiment = build_experiment(cfg, parts, provider, recorder, progress=progress, scorer=scorer, vision=vision)
        if catalog is not None:
            experiment.tools_catalog = catalog  # the preflight's: its run-scoped servers are up, in this loop
        return await experiment.run(parts.tasks)


def _completed_before(run_dir: Path, tasks: list[Any], resume: bool) -> int:
    if not resume:
        return 0
    return sum(1 for o in load_outcomes(run_dir, tasks) if o.status == "completed")


def plan_preflight(cfg: DictConfig) -> tuple[PreparedRun | None, list[ProviderTarget], list[str]]:
    """``prepare`` (the config problems) and what the live checks will reach; says on screen what they start."""
    parts, provider_cfg, problems = prepare_parts(cfg)
    if problems:
        # What needs no server (a missing key, dataset or provider.run_dir) is said before any server starts, and
        # a provider without its key is not probed (which could only add "cannot connect").
        raise PreflightError(problems)
    targets: list[ProviderTarget] = []
    if provider_cfg is not None:
        targets = preflight_targets(provider_cfg)
    if cfg.progress:
        servers = len(cfg.tools.get("servers") or {}) if cfg.preflight.tools else 0
        checked = sum(1 for t in targets if not t.cfg.emulator_script) if cfg.preflight.providers else 0
        ProgressReporter().status(
            f"preflight: starting {servers} tool server{'s' if servers != 1 else ''}, "
            f"checking {checked} provider{'s' if checked != 1 else ''}..."
        )
    return parts, targets, problems


async def run_preflight(
    cfg: DictConfig,
    planned: tuple[PreparedRun | None, list[ProviderTarget], list[str]],
    stack: contextlib.AsyncExitStack,
) -> PreparedRun:
    """The live checks (providers answer, tool servers start), then every problem at once. The tool catalog lives
    on ``stack``: its run-scoped servers serve the run's tasks."""
    parts, targets, problems = planned
    catalog = None
    try:
        catalog = await preflight(
            targets,
            cfg.tools,
            providers=bool(cfg.preflight.providers),
            tools=bool(cfg.preflight.tools),
            timeout_s=float(cfg.preflight.timeout_s),
            stack=stack,
        )
    except PreflightError as exc:
        # A tool entry that cannot work is found by prepare and again by the start-up check: say it once.
        problems.extend(problem for problem in exc.problems if problem not in problems)
    if problems or parts is None:
        raise PreflightError(problems)
    parts.tools_catalog = catalog
    return parts


def run_summary(
    cfg: DictConfig, parts: PreparedRun, result: RunResult, run_dir: Path, *, wall_seconds: float
) -> dict[str, Any]:
    """``summary.json`` of a run: one place, used by one process and by the parent of several workers."""
    tasks = parts.tasks
    summary = summarize(
        result.outcomes,
        total=len(tasks),
        wall_seconds=wall_seconds,
        interrupted=result.interrupted,
        resumed=result.resumed,
        model=priced_model(parts.provider_cfg),
        prices=parts.prices,
        attempts=cfg.experiment.attempts,
    )
    summary["status"] = "interrupted" if result.interrupted else "finished"
    if parts.provider_cfg.batch.enabled:  # billed at the batch factor (flowllm/providers/batch.py)
        summary["cost"] = batch_cost(summary["cost"], parts.prices, parts.provider_cfg.protocol, run_dir)
        summary["cost_usd"] = summary["cost"]["total_usd"]
    unavailable = result.tools_unavailable
    # None is "not known here", never "none": the parent of several workers does not see their tool servers.
    summary["tools"] = {
        "unavailable": dict(sorted(unavailable.items())) if unavailable is not None else None,
        # The run's shared servers start once, before the first task: their start-up is the run's, not a task's.
        "start_s": result.tools_start_s,
    }
    summary["experiment"] = cfg.experiment.name
    # The config choice (offline_chat), not the name it shares with another (offline): what the user picked.
    summary["provider"] = _choice("provider", cfg)
    summary["model"] = cfg.provider.model
    summary["runner"] = cfg.runner.name
    summary["repair"] = cfg.repair.name
    summary["dataset"] = str(cfg.dataset.path)
    # Calls per provider, retries, fallbacks, breaker events and the billed tokens of every attempt (failed
    # tasks included, unlike `usage`, which counts the tasks' recorded results), from the whole ledger.
    summary["providers"] = UsageLedger.read(run_dir / "usage.jsonl").summary()
    judge_provider = parts.judge_provider
    summary.update(
        scoring_summary(
            result.outcomes,
            scorer=cfg.dataset.scorer,
            fields=list(cfg.dataset.breakdown or []),
            run_dir=run_dir,
            judge_provider=None if judge_provider is None else judge_provider.name,
            judge_model=None if judge_provider is None else judge_provider.model,
            template=parts.judge_cfg.template if judge_provider is not None else None,
        )
    )
    # A fork: its live spending, and what a full live re-run would have cost (experiment/fork_accounting.py).
    summary.update(fork_summary(parts.provider_cfg, [o.task_id for o in result.outcomes], run_dir))
    summary["stats"] = run_stats(
        result.outcomes,
        tasks,
        epochs=int(cfg.experiment.epochs),
        reducer=Reducer(cfg.experiment.epoch_reducer),
        settings=stats_settings(cfg.stats),
        breakdown=list(cfg.dataset.breakdown or []),
    )
    summary["budget"] = budget_summary(
        spending_settings(cfg)[1], result.outcomes, run_dir, total=len(tasks), bills=read_bills(run_dir)
    )
    summary["acted"] = what_acted(
        summary["providers"], result.outcomes, run_dir=run_dir, snapshot=str(cfg.recorder.snapshot)
    )
    # What produced the numbers: versions, commit, dataset and price table hashes, the config fingerprint.
    summary["provenance"] = provenance.collect(run_dir, resolve_path(cfg.experiment.pricing, "experiment.pricing"))
    return summary


def sandbox_gaps(cfg: DictConfig) -> list[str] | None:
    """What run_python's sandbox cannot isolate on this machine, said once before the first task (None: the run
    has no tool-python, or replays its saved results)."""
    entry = (cfg.tools.get("servers") or {}).get("tool-python")
    args = [str(a) for a in entry.get("args") or []] if entry is not None else []
    if "flowllm.tools.python" not in args:
        return None
    if OmegaConf.select(cfg, "provider.protocol") == REPLAY_PROTOCOL and cfg.replay.tools == "saved":
        return None
    # The sandbox the server will use (--sandbox-backend, --isolation...), not the default one.
    server_args = args[args.index("flowllm.tools.python") + 1 :]
    try:
        limits = limits_from_args(server_args)
    except SystemExit:  # arguments the server refuses: it would not have started, which preflight reports
        limits = None
    gaps = probe_gaps(limits)
    if gaps:
        log.warning("flowllm: tool-python runs code in a weaker sandbox on this machine: %s", describe_gaps(gaps))
    return gaps


class _RunSession:
    """One run in one process: the preflight, then the tasks, in one event loop; what the summary needs after."""

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.parts: PreparedRun | None = None
        self.recorder: Recorder | None = None
        self.ledger: UsageLedger | None = None
        self.gaps: list[str] | None = None
        self.resumed = 0
        self.started = time.perf_counter()

    async def preflight_and_run(self, planned: tuple[PreparedRun | None, list[ProviderTarget], list[str]]) -> RunResult:
        cfg, run_dir = self.cfg, self.run_dir
        async with contextlib.AsyncExitStack() as stack:
            # The web cache and the loopback web fixture server (tools.web_fixtures) come first: the tool servers
            # the preflight starts serve the run, so they must be given their addresses when they start.
            fixtures_url = await stack.enter_async_context(web_tools(cfg, run_dir))
            parts = self.parts = await run_preflight(cfg, planned, stack)
            self.gaps = await asyncio.to_thread(sandbox_gaps, cfg)
            self.started = time.perf_counter()
            self.resumed = _completed_before(run_dir, parts.tasks, cfg.experiment.resume)
            # Every key the run may send (pools, fallbacks) is masked wherever it would appear in an artifact.
            secrets = provider_secrets(parts.provider_cfg)
            for other in (parts.judge_provider, parts.vision.provider_cfg if parts.vision is not None else None):
                if other is not None:
                    secrets += [s for s in provider_secrets(other) if s not in secrets]
            self.recorder = Recorder(run_dir, snapshot=cfg.recorder.snapshot, secrets=secrets)
            if (telemetry := attach_telemetry(cfg, self.recorder)) is not None:  # telemetry.otlp_endpoint
                stack.callback(telemetry.close)
            # One line per attempt, appended across resumed sessions: what was really spent, failures included.
            self.ledger = UsageLedger(run_dir / "usage.jsonl", prices=parts.prices, user=cfg.experiment.get("user"))
            return await _run_async(cfg, parts, self.recorder, self.ledger, fixtures_url)

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
        if self.ledger is not None:
            self.ledger.close()


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run the configured experiment into ``run_dir``; returns the summary."""
    # provider=replay without an experiment repeats the saved run's experiment (re-judging a saved run).
    cfg = inherit_replayed_run(cfg)
    steps = workers.AppSteps(
        prepare=prepare, build_experiment=build_experiment, priced_model=priced_model, run_summary=run_summary
    )
    if cfg.experiment.get("worker_shard"):  # one of the processes of experiment.workers=N
        return workers.run_shard(cfg, run_dir, steps)
    # The folder's results must come from these settings (experiment.resume=force mixes them, on record).
    dataset_path = resolve_path(cfg.dataset.path, "dataset.path")
    fingerprint.guard(cfg, run_dir, dataset_path, overrides=fingerprint.hydra_overrides())
    count = workers.resolve_workers(cfg.experiment.get("workers", 1))
    if count > 1 or str(cfg.experiment.get("executor", "local")) == "ray":
        return workers.run_parallel(cfg, run_dir, count, steps)
    planned = plan_preflight(cfg)
    session = _RunSession(cfg, run_dir)
    try:
        # One event loop for the preflight and the run: the tool servers the preflight starts serve the tasks.
        result = asyncio.run(session.preflight_and_run(planned))
    except KeyboardInterrupt:
        if session.recorder is None:  # interrupted before the first task: nothing ran, nothing to summarise
            raise
        # A second Ctrl-C, or one before the loop could cancel cleanly: what finished is on disk.
        result = None
    finally:
        session.close()
    parts, recorder, started = session.parts, session.recorder, session.started
    assert parts is not None and recorder is not None  # set before the run began (a failure raised above)
    if result is None:
        rules = workers.scorer_rules(cfg, run_dir) if cfg.dataset.scorer != "judge" else None
        result = RunResult(
            load_outcomes(run_dir, parts.tasks, rules), interrupted=True, resumed=session.resumed, tools_start_s=None
        )
    summary = run_summary(cfg, parts, result, run_dir, wall_seconds=time.perf_counter() - started)
    summary["tools"]["sandbox_gaps"] = session.gaps
    try:
        atomic_write(run_dir / "summary.json", recorder.redactor.dumps(summary))
    except RecordError as exc:  # tasks ran: a run error, whose exit code the tasks decide (never 2)
        summary.update(status="failed", error=str(exc))
        raise RunStopped(str(exc), summary) from exc
    print_summary(summary, result.outcomes, run_dir, bills=read_bills(run_dir))
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


def hydra_job(cfg: DictConfig) -> dict[str, Any]:
    """One Hydra job (a run, or one job of a multirun); started by flowllm.cli.run once the config composed."""
    protect_process()  # this process holds the API keys: no other process may read its memory or environ
    # One line per HTTP request or MCP message drowns the progress bar; our own warnings still show.
    for noisy in ("httpx2", "httpx", "httpcore2", "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        if multirun:  # a single run was checked before this module was imported (flowllm.cli.run)
            refuse_ignored_overrides(cfg)
        summary = run(cfg, run_dir)
    except FlowError as exc:
        # One line per problem (preflight lists every problem it found).
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"flowllm: error: {line}", file=sys.stderr)
        if not multirun:
            # By class: a build error is 2 (nothing ran); a run error after tasks ran follows its tasks.
            sys.exit(error_exit_code(exc))
        # A raising job would stop Hydra from calling on_multirun_end: report and move on. A run that stopped
        # after tasks ran keeps the summary it wrote (its status says it failed).
        if isinstance(exc, RunStopped) and exc.summary is not None:
            status = dict(exc.summary)
        else:
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
    # 130 (the shell's code for Ctrl-C) when interrupted; 3 or 4 when some or all tasks failed (flowllm/cli).
    code = run_exit_code(summary)
    if code is not ExitCode.OK:
        sys.exit(code)
    return summary
