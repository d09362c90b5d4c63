"""The Hydra application behind ``python -m flowllm``.

Everything a user can get wrong (config, dataset, keys, pipeline) is checked before the first task starts and
reported as one line on stderr with a non-zero exit; a traceback means a bug in flowllm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from flowllm.config.check import refuse_ignored_overrides
from flowllm.config.schema import register_configs
from flowllm.core.coordination import RedisLimits
from flowllm.datasets.shards import ShardSpec
from flowllm.engine import Recorder
from flowllm.engine.recorder import RecordError, Redactor, atomic_write
from flowllm.errors import FlowError, RunStopped
from flowllm.exit_codes import ExitCode, error_exit_code, run_exit_code
from flowllm.experiment import workers
from flowllm.providers import UsageLedger, open_provider, provider_secrets
from flowllm.providers.ledger import LedgerTail
from flowllm.providers.replay import REPLAY_PROTOCOL
from flowllm.run.budget_report import shared_spend
from flowllm.run.control import RunControl, attach_control
from flowllm.run.ctl_desk import ControlDesk
from flowllm.run.outcome import load_outcomes
from flowllm.run.progress import ProgressReporter
from flowllm.run.runner import RunResult
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import RunSummary
from flowllm.rundir.store import StoreMirror
from flowllm.scoring import open_scorer
from flowllm.setup import fingerprint
from flowllm.setup.build import (
    build_experiment,
    preflight_targets,
    prepare_parts,
    resolve_path,
    run_summary,
    selected_task_ids,
)
from flowllm.setup.config_record import has_config_record, write_config_record
from flowllm.setup.preflight import PreflightError, ProviderTarget, preflight
from flowllm.setup.prepared import PreparedRun
from flowllm.setup.rejudge import inherit_replayed_run
from flowllm.setup.settings import concurrency, store_settings, telemetry_endpoint
from flowllm.setup.steering import adaptive_limits, concurrency_text, requeue_check, steering
from flowllm.setup.vision import open_vision
from flowllm.setup.webconf import WebEnvironment, web_tools
from flowllm.spend.projection import Projector
from flowllm.spend.spending import SpendBook
from flowllm.sweep.summary import build_sweep_summary
from flowllm.sweep.tables import print_run_tables
from flowllm.telemetry.live import attach_telemetry
from flowllm.tools import PoolSettings
from flowllm.tools.python import limits_from_args, probe_gaps, server_arguments
from flowllm.tools.sandbox.execute import describe_gaps, protect_process

log = logging.getLogger("flowllm")

register_configs()
# ${flowllm_abspath:...}: launchers that run elsewhere (Ray) need absolute folders; hydra.sweep.dir is relative.
OmegaConf.register_new_resolver("flowllm_abspath", lambda p: str(Path(str(p)).resolve()), replace=True)


def key_values(api_key_env: str | None) -> list[str]:
    """The secret values the recorder must mask (every variable of a comma list)."""
    if not api_key_env:
        return []
    names = [n.strip() for n in str(api_key_env).split(",") if n.strip()]
    return [os.environ[n] for n in names if os.environ.get(n)]


async def _run_async(
    cfg: DictConfig, parts: PreparedRun, recorder: Recorder, ledger: UsageLedger, web: WebEnvironment
) -> RunResult:
    """The tasks, once the preflight passed; the web tool environment (``web_tools``) is up already."""
    budget = parts.experiment.budget
    projector = Projector(SpendBook.of_run(ledger.path.parent), budget) if ledger.path is not None else None
    # This session's calls: the agent's (its ledger's lines) and the judge's (appended from now on).
    judged = LedgerTail(RunLayout(ledger.path.parent).judge_ledger, from_end=True) if ledger.path else None
    # flowllm ctl RUN ...: the desk answers; this process follows (flowllm/setup/steering.py)
    coordination = parts.experiment.coordination
    limits = RedisLimits(coordination) if coordination is not None else None  # else this machine's (limiter.py)
    adaptive = adaptive_limits(parts.experiment, shared_value=limits.value if limits is not None else None)
    desk = ControlDesk(
        recorder.run_dir, failed=requeue_check(recorder.run_dir, parts.tasks), shared_budget=coordination is not None
    )
    shown = concurrency_text(parts.experiment, adaptive, desk)
    progress = ProgressReporter(
        enabled=bool(cfg.progress),
        ledger=ledger,
        judge_ledger=judged,
        interval_s=float(cfg.experiment.progress_interval_s),
        projector=projector,
        concurrency=shown,
    )
    desk.status = lambda: {"total": progress.total, "done": progress.done, "concurrency": shown()}
    catalog = parts.tools_catalog
    scorer_ctx = open_scorer(
        cfg.dataset.scorer,
        judge=parts.judge_cfg,
        judge_provider=parts.judge_provider,
        run_dir=recorder.run_dir,
        redactor=recorder.redactor,
        prices=parts.prices,
        providers=parts.providers,
    )
    async with (
        steering(desk),
        open_provider(
            parts.provider_cfg, ledger=ledger, resolve=parts.providers, limits=limits, adaptive=adaptive
        ) as provider,
        open_vision(
            parts.vision,
            ledger=ledger,
            cache_env=web.env,
            fixtures_url=web.fixtures_url,
            resolve=parts.providers,
        ) as vision,
        scorer_ctx as scorer,
    ):
        experiment = build_experiment(cfg, parts, provider, recorder, progress=progress, scorer=scorer, vision=vision)
        attach_control(experiment, RunControl(recorder.run_dir, parts.experiment.max_concurrent))
        if catalog is not None:
            experiment.tools_catalog = catalog  # the preflight's: its run-scoped servers are up, in this loop
        try:
            return await experiment.run(parts.tasks)
        finally:
            if limits is not None:
                await limits.aclose()


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
    if provider_cfg is not None and parts is not None:
        targets = preflight_targets(provider_cfg, parts.providers)
    if cfg.progress and parts is not None:
        servers = len(parts.tools.servers) if cfg.preflight.tools else 0
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
    web: WebEnvironment,
) -> PreparedRun:
    """The live checks (providers answer, tool servers start), then every problem at once. The tool servers get
    the run's web environment (``web``). The tool catalog lives on ``stack``: its run-scoped servers serve the
    run's tasks."""
    parts, targets, problems = planned
    if parts is None:
        raise PreflightError(problems)
    parts.tools = web.apply(parts.tools)
    catalog = None
    try:
        catalog = await preflight(
            targets,
            parts.tools,
            providers=bool(cfg.preflight.providers),
            tools=bool(cfg.preflight.tools),
            timeout_s=float(cfg.preflight.timeout_s),
            stack=stack,
        )
    except PreflightError as exc:
        # A tool entry that cannot work is found by prepare and again by the start-up check: say it once.
        problems.extend(problem for problem in exc.problems if problem not in problems)
    if problems:
        raise PreflightError(problems)
    parts.tools_catalog = catalog
    return parts


def sandbox_gaps(cfg: DictConfig, tools: PoolSettings) -> list[str] | None:
    """What run_python's sandbox cannot isolate on this machine, said once before the first task (None: the run
    has no tool-python, or replays its saved results)."""
    found = [args for spec in tools.servers if (args := server_arguments(spec)) is not None]
    if not found:
        return None
    if OmegaConf.select(cfg, "provider.protocol") == REPLAY_PROTOCOL and cfg.replay.tools == "saved":
        return None
    try:  # the sandbox the server will use (--sandbox-backend, --isolation...), not the default one
        limits = limits_from_args(found[0])
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
            web = await stack.enter_async_context(web_tools(cfg, run_dir))
            parts = self.parts = await run_preflight(cfg, planned, stack, web)
            self.gaps = await asyncio.to_thread(sandbox_gaps, cfg, parts.tools)
            self.started = time.perf_counter()
            self.resumed = _completed_before(run_dir, parts.tasks, cfg.experiment.resume)
            # Every key the run may send (pools, fallbacks) is masked wherever it would appear in an artifact.
            secrets = provider_secrets(parts.provider_cfg, resolve=parts.providers)
            for other in (parts.judge_provider, parts.vision.provider_cfg if parts.vision is not None else None):
                if other is not None:
                    secrets += [s for s in provider_secrets(other, resolve=parts.providers) if s not in secrets]
            self.recorder = Recorder(run_dir, snapshot=cfg.recorder.snapshot, secrets=secrets)
            # telemetry.otlp_endpoint: spans of every node, sent as the run goes
            telemetry = attach_telemetry(telemetry_endpoint(cfg), self.recorder, protocol=parts.provider_cfg.protocol)
            if telemetry is not None:
                stack.callback(telemetry.close)
            # One line per attempt, appended across resumed sessions: what was really spent, failures included.
            self.ledger = UsageLedger(RunLayout(run_dir).ledger, prices=parts.prices, user=cfg.experiment.get("user"))
            return await _run_async(cfg, parts, self.recorder, self.ledger, web)

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
        if self.ledger is not None:
            self.ledger.close()


def say_shard(shard: ShardSpec | None, *, shared: bool) -> None:
    """Once, at the start of a shard's run: what it runs, and whether its limits and budget are its own."""
    if shard is None:
        return
    if shared:
        log.info(
            "flowllm: shard %s: rate limits and experiment.budget are the run's, kept with the other shards", shard
        )
        return
    log.warning(
        "flowllm: shard %s: this process runs its slice of the tasks; rate limits and experiment.budget are per "
        "shard (each shard holds them alone); `flowllm merge` puts the shards' folders together",
        shard,
    )


def own_telemetry(cfg: DictConfig, composed: DictConfig) -> DictConfig:
    """``cfg`` with the telemetry of this session's own config: a replay or fork that repeats a saved run's
    experiment never sends spans to the receiver the saved run had (``telemetry.otlp_endpoint``)."""
    if cfg is not composed:
        with open_dict(cfg):
            cfg.telemetry = composed.telemetry
    return cfg


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run the configured experiment into ``run_dir``; returns the summary."""
    composed = cfg
    # provider=replay without an experiment repeats the saved run's experiment (re-judging a saved run).
    cfg = own_telemetry(inherit_replayed_run(cfg), composed)
    if cfg.experiment.get("worker_shard"):  # one of the processes of experiment.workers=N
        return workers.run_shard(cfg, run_dir)
    say_shard(
        ShardSpec.parse(cfg.experiment.get("shard")), shared=bool(cfg.experiment.get("coordination"))
    )  # a bad spec: one line, exit 2, nothing written
    # experiment.store: reachable before anything runs; a rerun continues the store's run (its files pulled first)
    store = store_settings(cfg)
    pulled = store.pull_missing(run_dir) if store is not None else []
    # The folder's results must come from these settings (experiment.resume=force mixes them, on record).
    dataset_path = resolve_path(cfg.dataset.path, "dataset.path")
    # How many calls this session can have in flight: how far past a budget it may spend (flowllm verify).
    at_once = {
        "tasks": concurrency(cfg.experiment.max_concurrent)[0],
        "workers": workers.resolve_workers(cfg.experiment.get("workers", 1)),
    }
    selected = selected_task_ids(cfg)
    if selected is not None:  # every task the folder holds a result of: the summary counts what it selects
        fingerprint.check_selection(run_dir, selected)
    fingerprint.guard(cfg, run_dir, dataset_path, overrides=fingerprint.hydra_overrides(), concurrency=at_once)
    # The config as it ran (a replay's inherited experiment included), written only now: a refused rerun leaves
    # the saved run's config as it was.
    write_config_record(cfg, run_dir)
    if store is None:
        return _run_here(cfg, run_dir)
    mirror = StoreMirror(store, run_dir, on_error=log.warning)
    mirror.mark_present(pulled)
    with mirror:  # every finished file put to the store as the run goes, and all of them at its end
        return _run_here(cfg, run_dir)


def _run_here(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The run in ``run_dir`` once the folder accepted it: the workers, or the tasks in this process."""
    count = workers.resolve_workers(cfg.experiment.get("workers", 1))
    if count > 1 or str(cfg.experiment.get("executor", "local")) == "ray":
        return workers.run_parallel(cfg, run_dir, count)
    planned = plan_preflight(cfg)
    session = _RunSession(cfg, run_dir)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started with SIGINT ignored (a script's background job inherits that): the run still stops on it, as the
        # workers' parent does and as `flowllm ctl stop` needs (it sends the run SIGINT). asyncio.run then handles
        # it: the first one cancels the tasks and the summary says interrupted.
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
    # Under experiment.coordination the budget is every process's together: what they spent is read from Redis.
    shared = shared_spend(parts.experiment.budget, parts.experiment.coordination, run_dir)
    summary = run_summary(cfg, parts, result, run_dir, wall_seconds=time.perf_counter() - started, shared=shared)
    if summary.tools is not None:
        summary.tools.sandbox_gaps = session.gaps
    try:
        atomic_write(RunLayout(run_dir).summary, recorder.redactor.dumps(summary.to_dict()))
    except RecordError as exc:  # tasks ran: a run error, whose exit code the tasks decide (never 2)
        summary.status, summary.error = "failed", str(exc)
        raise RunStopped(str(exc), summary.to_dict()) from exc
    # A closed stdout (| tee, stopped by the same Ctrl-C) is no failure of the run: the table goes to stderr.
    print_run_tables(summary, result.outcomes, run_dir)
    return summary.to_dict()


def _job_error(cfg: DictConfig, run_dir: Path, message: str) -> dict[str, Any]:
    """A multirun job that could not run: its folder says why, and the sweep summary shows the row."""
    status = RunSummary.job_error(message).to_dict()
    secrets = key_values(OmegaConf.select(cfg, "provider.api_key_env", default=None))
    atomic_write(RunLayout(run_dir).summary, Redactor(secrets).dumps(status))
    if not has_config_record(run_dir):  # a new folder: the sweep finds its row by it (a run's is never replaced)
        write_config_record(cfg, run_dir)
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
    for noisy in ("httpx2", "httpx", "httpcore2", "mcp", "botocore", "aiobotocore"):
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
        record = RunSummary.from_dict(summary)
        return {"status": record.status, "accuracy": record.accuracy, "cost_usd": record.cost_usd}
    # 130 (the shell's code for Ctrl-C) when interrupted; 3 or 4 when some or all tasks failed (flowllm/cli).
    code = run_exit_code(summary)
    if code is not ExitCode.OK:
        sys.exit(code)
    return summary
