"""A run built from its composed config: every check before the first task, and the wiring of the experiment.

``prepare`` validates everything and builds a ``PreparedRun`` (every problem listed at once);
``build_experiment`` wires the agent and the experiment on an open provider; ``run_summary`` writes what
``summary.json`` says. One process runs them (``flowllm.app``), and so do the workers of
``experiment.workers=N`` (``experiment/workers.py``) and the benchmarks, so that what is measured is what runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from flowllm.agent.loop import Agent
from flowllm.agent.results import AgentSettings
from flowllm.agent.subagents import SubAgentSpec
from flowllm.agent.turn import AGENT_TURN
from flowllm.agent.vision import VisionSpec
from flowllm.config.plain import plain_config
from flowllm.config.provider_schema import ProviderConfig
from flowllm.config.providers import NameResolver, default_resolver
from flowllm.config.schema import JudgeConfig, Reducer, RunnerConfig
from flowllm.datasets.adapters import DatasetSpec, load_dataset
from flowllm.datasets.shards import SHARD_SETTING, ShardSpec
from flowllm.engine import Recorder
from flowllm.engine.pipeline import pipeline_from_config
from flowllm.engine.runners import runner_from_config
from flowllm.errors import ConfigError, FlowError
from flowllm.export.contamination import audit_run
from flowllm.providers import UsageLedger, check_provider_config
from flowllm.providers.fork import ForkProvider, check_fork_pipeline, live_config
from flowllm.providers.registry import ProviderTable, Resolver
from flowllm.providers.replay import (
    REPLAY_PROTOCOL,
    ReplayProvider,
    check_replay_epochs,
    resolve_run_dir,
    source_provider_config,
)
from flowllm.resources import bundled
from flowllm.run.budget_report import SharedReading, batch_cost, billed_cost, budget_summary
from flowllm.run.progress import ProgressReporter
from flowllm.run.replay_audit import ReplayAudit
from flowllm.run.report import what_acted
from flowllm.run.resume import TaskResume
from flowllm.run.runner import Experiment, RunResult
from flowllm.run.stats import check_stats, run_stats, stats_settings
from flowllm.run.summary import summarize
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import BudgetBlock, CostBlock, ForkBlock, RunSummary, StatsBlock, ToolsBlock
from flowllm.scoring import check_scorer, judge_provider_config
from flowllm.scoring.judge import judge_template
from flowllm.scoring.report import scoring_summary
from flowllm.scoring.scorers import Scorer
from flowllm.setup import provenance
from flowllm.setup.preflight import PreflightError, ProviderTarget
from flowllm.setup.prepared import PreparedRun
from flowllm.setup.settings import check_settings, coordination_settings, experiment_settings, spending_settings
from flowllm.setup.vision import plan_vision, unavailable_tools
from flowllm.setup.webconf import check_web_tools
from flowllm.spend.fork_accounting import fork_summary
from flowllm.spend.pricing import PriceTable
from flowllm.spend.saved_stops import SavedStops
from flowllm.spend.spending import refuse_unpriced
from flowllm.spend.task_usage import read_bills
from flowllm.tools import load_settings, open_tool_pool


def resolve_path(value: str, setting: str) -> Path:
    """A relative path is looked up from the working directory, then among the bundled files (resources.py)."""
    return bundled(value)


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


def _pipeline(cfg: DictConfig) -> tuple[Any, Any]:
    source = f"conf/pipeline/{_choice('pipeline', cfg)}.yaml"
    pipeline = pipeline_from_config(plain_config(cfg.pipeline), source=source, contract=AGENT_TURN)
    runner = runner_from_config(cast(RunnerConfig, OmegaConf.to_object(cfg.runner)))
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


def _judge(cfg: DictConfig, resolve: Resolver) -> tuple[JudgeConfig, ProviderConfig | None]:
    """The scorer's judge: its settings, and its provider when the dataset is judged."""
    check_scorer(cfg.dataset.scorer)
    judge_cfg = cast(JudgeConfig, OmegaConf.to_object(cfg.judge))
    judge_provider: ProviderConfig | None = None
    if cfg.dataset.scorer == "judge":
        judge_template(judge_cfg.template)
        judge_provider = judge_provider_config(judge_cfg, resolve)
        check_provider_config(judge_provider, resolve=resolve)
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
    problems.check(lambda: check_settings(cfg))
    pipeline_runner = problems.check(lambda: _pipeline(cfg))
    spend_caps = problems.check(lambda: spending_settings(cfg))  # agent.limits, experiment.budget
    provider_cfg: ProviderConfig | None = problems.check(lambda: _provider(cfg))
    # Every provider the run names, read once (fallbacks, aliases, agent models, judge, vision, a fork's live one).
    names = NameResolver(default_resolver(provider_cfg)) if provider_cfg is not None else None
    if provider_cfg is not None:
        problems.check(lambda: check_provider_config(provider_cfg, resolve=names))
        if pipeline_runner is not None:  # a fork needs the saved run's nodes in this pipeline
            problems.check(lambda: check_fork_pipeline(provider_cfg, pipeline_runner[0]))
        problems.check(lambda: check_replay_epochs(provider_cfg, int(cfg.experiment.epochs)))
    problems.check(lambda: check_web_tools(cfg))
    # ToolConfigError: a server entry that cannot work, before anything starts.
    tools = problems.check(lambda: load_settings(plain_config(cfg.tools)))
    tasks = problems.check(
        lambda: load_dataset(
            DatasetSpec.from_config(plain_config(cfg.dataset), resolve_path(cfg.dataset.path, "dataset.path"))
        )
    )
    shard = problems.check(lambda: ShardSpec.parse(OmegaConf.select(cfg, SHARD_SETTING)))
    if tasks is not None and shard is not None:
        tasks = shard.select(tasks)  # experiment.shard=I/N: this process's slice of the selected tasks
    if tasks is not None:
        problems.check(lambda: check_stats(cfg.stats, tasks))
    judge = vision = None
    if provider_cfg is not None and names is not None:
        judge = problems.check(lambda: _judge(cfg, names))
        vision = problems.check(lambda: plan_vision(cfg.tools, provider_cfg, names))
    prices = problems.check(lambda: PriceTable.load(resolve_path(cfg.experiment.pricing, "experiment.pricing")))
    subagents = problems.check(lambda: subagent_specs(cfg))
    # experiment.coordination: Redis answers, before anything starts (a dataset that cannot be read says so above)
    dataset_path = resolve_path(cfg.dataset.path, "dataset.path")
    coordination = problems.check(lambda: coordination_settings(cfg, dataset_path))
    if prices is not None and provider_cfg is not None and judge is not None and spend_caps is not None:
        models = billed_models(provider_cfg, names)
        models += [c.model for c in (judge[1], vision.provider_cfg if vision is not None else None) if c is not None]
        problems.check(lambda: refuse_unpriced(models, prices, *spend_caps))
    if problems.found:
        return None, provider_cfg, problems.found
    assert provider_cfg is not None and names is not None and judge is not None  # else problems were found above
    pipeline, runner = pipeline_runner
    prepared = PreparedRun(
        pipeline=pipeline,
        runner=runner,
        provider_cfg=provider_cfg,
        tasks=tasks,
        settings=AgentSettings(
            max_turns=cfg.agent.max_turns,
            system_prompt=cfg.agent.system_prompt,
            summary_prompt=cfg.agent.summary_prompt,
        ),
        prices=prices,
        subagents=subagents,
        judge_cfg=judge[0],
        judge_provider=judge[1],
        vision=vision,
        providers=ProviderTable(dict(names.resolved)),
        tools=tools,
        experiment=experiment_settings(cfg, spend_caps[0], spend_caps[1], coordination),
    )
    return prepared, provider_cfg, []


def selected_task_ids(cfg: DictConfig) -> list[str] | None:
    """The ids of the tasks this run selects (its dataset settings, its shard); None when they cannot be read
    (``prepare`` says why, with the other problems)."""
    try:
        tasks = load_dataset(
            DatasetSpec.from_config(plain_config(cfg.dataset), resolve_path(cfg.dataset.path, "dataset.path"))
        )
        shard = ShardSpec.parse(OmegaConf.select(cfg, SHARD_SETTING))
        return [task.task_id for task in (shard.select(tasks) if shard is not None else tasks)]
    except FlowError:
        return None


def preflight_targets(provider_cfg: ProviderConfig, resolve: Resolver | None) -> list[ProviderTarget]:
    """The providers of the run: the main one and every fallback, alias and agent model it routes to."""
    try:
        plan = check_provider_config(provider_cfg, resolve=resolve)
    except FlowError:  # reported by prepare; the main provider can still be reached
        plan = None
    if plan is None:
        return [ProviderTarget(provider_cfg.name, provider_cfg)]
    members = [ProviderTarget(m.id, m.cfg) for m in plan.members.values()]
    return members or [ProviderTarget(provider_cfg.name, provider_cfg)]


def billed_models(provider_cfg: ProviderConfig, resolve: Resolver | None) -> list[str]:
    """The models the run's own calls bill: each target's, but a replay bills none of its replayed calls, and a
    fork bills its live provider's."""
    if provider_cfg.protocol != REPLAY_PROTOCOL:
        return [t.cfg.model for t in preflight_targets(provider_cfg, resolve)]
    if provider_cfg.fork is None:
        return []
    try:
        return [live_config(provider_cfg, resolve).model]
    except FlowError:  # reported by prepare, with what to do
        return []


def priced_model(provider_cfg: ProviderConfig) -> str:
    """The model whose prices apply: a replay's is the replayed run's model."""
    if provider_cfg.protocol == REPLAY_PROTOCOL and provider_cfg.run_dir:
        return source_provider_config(resolve_run_dir(provider_cfg.run_dir))[0].model
    return provider_cfg.model


def subagent_specs(cfg: DictConfig) -> dict[str, SubAgentSpec]:
    """``subagents.<name>`` configs as the agent loop's specs."""
    specs: dict[str, SubAgentSpec] = {}
    for name, sub in (cfg.get("subagents") or {}).items():
        if sub.max_turns < 1:
            raise ConfigError(f"subagents.{name}.max_turns must be at least 1, not {sub.max_turns}")
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
    # replays from diverged ones (flowllm/run/replay_audit.py).
    audit = (
        ReplayAudit(
            RunLayout(provider.run_dir),
            recorder.redactor.dumps,
            recorder,
            forks=provider.forks if isinstance(provider, ForkProvider) else None,
            saved_outputs=provider.output_taker(),  # the call node's saved output, as send read it
        )
        if isinstance(provider, ReplayProvider)
        else None
    )
    observer = audit if audit is not None else recorder
    # experiment.resume: an unfinished task continues from its own saved turns (flowllm/run/resume.py).
    resume = None
    if parts.experiment.resume:
        resume = TaskResume.open(recorder.run_dir, provider, observer, recorder.redactor.dumps)
    agent = Agent(
        parts.pipeline,
        parts.runner,
        parts.settings,
        observer=resume.audit if resume is not None else observer,
        subagents=parts.subagents,
        vision=vision,
    )
    return Experiment(
        agent=agent,
        provider=resume.provider if resume is not None else provider,
        tools=parts.tools,
        recorder=recorder,
        settings=parts.experiment,
        progress=progress,
        open_tools=open_tools,
        audit=audit,
        scorer=scorer,
        breakdown=list(cfg.dataset.breakdown or []),
        tools_unavailable=unavailable_tools(parts.vision),
        resume=resume,
        stops=SavedStops.of_replay(parts.provider_cfg),  # a plain replay stops where the saved run stopped
    )


def _budget_block(parts: PreparedRun, result: RunResult, run_dir: Path, shared: SharedReading | None) -> BudgetBlock:
    """``summary.json → budget``: what the caps did (run/budget_report.py), each task's bill from the ledgers."""
    bills = read_bills(run_dir)
    caps = parts.experiment.budget
    unread = shared is not None and shared.spend is None
    seen = result.budget_halt if unread else None
    stops = SavedStops.of_replay(parts.provider_cfg)  # a plain replay stops where its saved run's budget did
    if stops is not None and stops.ended_run:
        seen = stops.reason
    return BudgetBlock.from_dict(
        budget_summary(
            caps,
            result.outcomes,
            run_dir,
            total=len(parts.tasks),
            bills=bills,
            shared=shared,
            seen=seen,
        )
    )


def run_summary(
    cfg: DictConfig,
    parts: PreparedRun,
    result: RunResult,
    run_dir: Path,
    *,
    wall_seconds: float,
    shared: SharedReading | None = None,  # experiment.coordination: the spend of every process sharing the budget
) -> RunSummary:
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
    summary.status = "interrupted" if result.interrupted else "finished"
    priced = summary.cost.to_dict() if summary.cost is not None else {}
    if parts.provider_cfg.batch.enabled:  # billed at the batch factor (flowllm/providers/batch.py)
        priced = batch_cost(priced, parts.prices, parts.provider_cfg.protocol, run_dir)
    unavailable = result.tools_unavailable
    # None is "not known here", never "none": the parent of several workers does not see their tool servers.
    summary.tools = ToolsBlock(
        unavailable=dict(sorted(unavailable.items())) if unavailable is not None else None,
        # The run's shared servers start once, before the first task: their start-up is the run's, not a task's.
        start_s=result.tools_start_s,
    )
    summary.experiment = cfg.experiment.name
    # The config choice (offline_chat), not the name it shares with another (offline): what the user picked.
    summary.provider = _choice("provider", cfg)
    summary.model = cfg.provider.model
    summary.runner = cfg.runner.name
    summary.repair = cfg.repair.name
    summary.dataset = str(cfg.dataset.path)
    # Calls per provider, retries, fallbacks, breaker events and the billed tokens of every attempt (failed
    # tasks included, unlike `usage`, which counts the tasks' recorded results), from the whole ledger.
    summary.providers = UsageLedger.read(RunLayout(run_dir).ledger).summary()
    judge_provider = parts.judge_provider
    summary.merge(
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
    # A fork: its live spending, and what a full live re-run would have cost (spend/fork_accounting.py).
    fork = fork_summary(parts.provider_cfg, [o.task_id for o in result.outcomes], run_dir)
    if fork:
        summary.fork = ForkBlock.from_dict(fork["fork"])
        priced = fork["cost"]
    summary.cost = CostBlock.from_dict(billed_cost(priced, run_dir))  # the headline: the ledgers, every call
    summary.cost_usd = summary.cost.total_usd
    summary.stats = StatsBlock.from_dict(
        run_stats(
            result.outcomes,
            tasks,
            epochs=int(cfg.experiment.epochs),
            reducer=Reducer(cfg.experiment.epoch_reducer),
            settings=stats_settings(cfg.stats),
            breakdown=list(cfg.dataset.breakdown or []),
        )
    )
    summary.budget = _budget_block(parts, result, run_dir, shared)
    # The guard's blocks and the tasks whose answer came from outside their files (export/contamination.py).
    patterns = OmegaConf.select(cfg, "tools.web.answer_patterns", default=None) or []
    summary.contamination = audit_run(run_dir, patterns).block(stats_settings(cfg.stats))
    summary.acted = what_acted(summary.providers, result.outcomes, run_dir=run_dir, snapshot=str(cfg.recorder.snapshot))
    # What produced the numbers: versions, commit, dataset and price table hashes, the config fingerprint.
    summary.provenance = provenance.collect(run_dir, resolve_path(cfg.experiment.pricing, "experiment.pricing"))
    return summary
