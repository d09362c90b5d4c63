"""``experiment.workers=N``: one run's tasks spread over N processes of this machine.

The parent (the app the user started) checks everything as a one-process run does, picks the tasks still to
run (dataset order, resume applied), deals them round-robin into N shards and starts N children: the same app
(``python -m flowllm`` with the same overrides) in worker mode (``experiment.worker_shard`` names the shard
file). Each child has its own event loop, provider clients and tool pools, writes only its own tasks' folders
into the shared run directory and appends to the shared ``usage.jsonl`` (one ``write()`` of a whole line per
entry on a file opened with O_APPEND: lines of several processes never interleave). Children write no summary.

The parent shows the one progress display, following the ``result.json`` files as they appear, and builds the
one ``summary.json`` from them and the ledger, like a one-process run. Ctrl-C or SIGTERM to the parent is
forwarded once to every child as SIGINT (each cancels its running tasks, keeps what finished and exits 130);
the parent then reports the run interrupted and exits 130. Children die with the parent (Linux
``PR_SET_PDEATHSIG``, else a watchdog on the parent's pid), so SIGKILL leaves what it leaves with one process:
finished tasks on disk, nothing half-counted, and a rerun into the same folder resumes.

``experiment.max_concurrent`` stays the whole run's: each worker runs its share of it (the shares add up to it;
never more workers than that). Rate limits (``provider.rate_limit`` of the provider and of every fallback or
alias target) are per process, so each of the N workers gets 1/N of requests_per_minute and tokens_per_minute,
and a share of max_in_flight that adds up to it (a max_in_flight below N is refused: a worker cannot have less
than one request at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import orjson
from omegaconf import DictConfig, OmegaConf

from flowllm.config.provider_schema import ProviderConfig, RateLimitConfig
from flowllm.engine import Recorder
from flowllm.engine.recorder import RecordError, Redactor, atomic_write
from flowllm.errors import ConfigError, RunStopped
from flowllm.experiment.children import SHARD_KEY, die_with, quoted, shard_override
from flowllm.experiment.ray_executor import RayPool, budget_share, cost_share
from flowllm.providers import UsageLedger, check_provider_config, open_provider, provider_secrets
from flowllm.providers.ledger import LedgerTail
from flowllm.providers.limiter import SHARED_PAUSES_ENV
from flowllm.providers.registry import ProviderTable, Resolver
from flowllm.run.budget_report import budget_spent
from flowllm.run.control import RunControl, attach_control, share
from flowllm.run.ctl_desk import ControlDesk
from flowllm.run.outcome import FINISHED, TaskOutcome, read_outcome, stopped_by_budget
from flowllm.run.progress import ProgressReporter
from flowllm.run.runner import RunResult
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import RunSummary
from flowllm.scoring import JudgeScorer, open_scorer
from flowllm.scoring.scorers import RuleScore
from flowllm.setup.build import build_experiment, prepare, run_summary
from flowllm.setup.prepared import PreparedRun
from flowllm.setup.settings import telemetry_endpoint
from flowllm.setup.steering import adaptive_limits, concurrency_text, requeue_check
from flowllm.setup.vision import open_vision
from flowllm.setup.webconf import web_tools
from flowllm.spend.projection import Projector
from flowllm.spend.saved_stops import SavedStops
from flowllm.spend.spending import RunBudget, SpendBook
from flowllm.sweep.tables import print_run_tables
from flowllm.telemetry.live import attach_telemetry

if TYPE_CHECKING:
    from flowllm.datasets.task import Task

MAX_WORKERS = 64  # far above any one machine's useful count; a typo (workers=1000) fails instead
POLL_S = 1.0  # how often the parent looks for new result.json files and exited children
CONTROL_POLL_S = 0.1  # how often it looks for flowllm ctl's requests
# Hydra overrides of the parent's own job that a worker must not inherit: it runs into the parent's folder,
# once, in run mode.
_PARENT_ONLY = (
    "hydra.run.",
    "hydra.sweep.",
    "hydra.mode",
    "hydra.job.",
    "hydra.runtime.",
    "hydra.output_subdir",
    "hydra/launcher",
    "hydra.launcher",
    "hydra/sweeper",
    "hydra.sweeper",
)


def resolve_workers(value: Any) -> int:
    """``experiment.workers`` as a count: an int in [1, MAX_WORKERS], or ``auto`` (the usable cores)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise ConfigError(f"experiment.workers must be auto or a whole number from 1 to {MAX_WORKERS}, not {value!r}")
    return value


def deal(task_ids: list[str], count: int) -> list[list[str]]:
    """Round-robin shards (dataset order within each): worker i gets tasks i, i+N, i+2N..."""
    return [task_ids[i::count] for i in range(count)]


@dataclass
class Shard:
    """What one worker runs: its place among the workers and its tasks (dataset order)."""

    index: int
    of: int
    task_ids: list[str]
    parent_pid: int
    budget: dict[str, Any] | None = None  # experiment.executor=ray: this worker's share of the run's budget
    # experiment.executor=ray: what the run had spent when the workers started (a budget `flowllm ctl` sets is
    # shared from there, as the starting one is)
    spent_usd: float | None = None

    def save(self, path: Path) -> None:
        path.write_bytes(orjson.dumps(self.__dict__))

    @classmethod
    def load(cls, path: Path | str) -> Shard:
        try:
            return cls(**orjson.loads(Path(path).read_bytes()))
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(f"experiment.worker_shard '{path}' cannot be read: {exc}") from None


# ----- each worker's share of the run's limits ------------------------------------------------------------
def share_rate_limit(cfg: RateLimitConfig, index: int, of: int) -> RateLimitConfig:
    """Worker ``index`` of ``of``: 1/of of the per-minute budgets, a share of max_in_flight adding up to it."""
    return RateLimitConfig(
        requests_per_minute=None if cfg.requests_per_minute is None else float(cfg.requests_per_minute) / of,
        tokens_per_minute=None if cfg.tokens_per_minute is None else float(cfg.tokens_per_minute) / of,
        max_in_flight=None if cfg.max_in_flight is None else share(int(cfg.max_in_flight), index, of),
    )


def _shared(pcfg: ProviderConfig, index: int, of: int) -> ProviderConfig:
    shared = copy.deepcopy(pcfg)
    shared.rate_limit = share_rate_limit(pcfg.rate_limit, index, of)
    return shared


def shared_provider(
    pcfg: ProviderConfig, providers: ProviderTable, index: int, of: int
) -> tuple[ProviderConfig, ProviderTable]:
    """The provider config of worker ``index``, and the configs its fallbacks name (``providers``: the run's),
    each with the worker's share of its rate limits."""
    shares = {name: _shared(cfg, index, of) for name, cfg in providers.configs.items()}
    return _shared(pcfg, index, of), ProviderTable(shares)


def check_in_flight(pcfg: ProviderConfig, providers: Resolver, workers: int) -> None:
    """A max_in_flight below the worker count cannot be shared out (a worker needs at least one slot)."""
    plan = check_provider_config(pcfg, resolve=providers)
    members = [(pcfg.name, pcfg)] if plan is None else [(m.id, m.cfg) for m in plan.members.values()]
    for name, cfg in members:
        flight = cfg.rate_limit.max_in_flight
        if flight is not None and flight < workers:
            raise ConfigError(
                f"provider '{name}': rate_limit.max_in_flight={flight} cannot be shared by experiment.workers="
                f"{workers} (each worker needs at least one request at once): lower workers or raise the limit"
            )


# ----- the worker (child) ----------------------------------------------------------------------------------
def _watch_parent(parent_pid: int) -> None:
    """Where PR_SET_PDEATHSIG is missing: a thread that ends this worker once its parent is gone."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="flowllm-parent-watch", daemon=True).start()


async def _run_shard_async(
    cfg: DictConfig,
    parts: PreparedRun,
    tasks: list[Task],
    shard: Shard,
    recorder: Recorder,
    ledger: UsageLedger,
    control: RunControl,
) -> RunResult:
    pcfg, resolve = shared_provider(parts.provider_cfg, parts.providers, shard.index, shard.of)
    # max_concurrent=auto: the run's one limit of calls in flight per provider and model, beside the 429 pauses
    folder = os.environ.get(SHARED_PAUSES_ENV)
    adaptive = adaptive_limits(parts.experiment, workers=shard.of, shared_dir=Path(folder) if folder else None)
    # Each worker sets up the web tool environment for the servers it starts, as a one-process run does: the
    # run's one web cache (written atomically, so workers share it) and, offline, a fixture server and an audio
    # emulator of its own (they keep no state a task could see).
    # dataset.scorer=judge: each worker judges its own tasks' answers, with its share of the judge's rate limits,
    # into the run's one judge ledger (appended a whole line at a time, as usage.jsonl is).
    judge = None if parts.judge_provider is None else _shared(parts.judge_provider, shard.index, shard.of)
    async with (
        web_tools(cfg, recorder.run_dir) as web,
        open_provider(pcfg, ledger=ledger, resolve=resolve, adaptive=adaptive) as provider,
        open_vision(
            parts.vision, ledger=ledger, cache_env=web.env, fixtures_url=web.fixtures_url, resolve=parts.providers
        ) as vision,
        open_scorer(
            cfg.dataset.scorer,
            judge=parts.judge_cfg,
            judge_provider=judge,
            run_dir=recorder.run_dir,
            redactor=recorder.redactor,
            prices=parts.prices,
            providers=resolve,
        ) as scorer,
    ):
        parts.tools = web.apply(parts.tools)
        experiment = build_experiment(cfg, parts, provider, recorder, progress=None, scorer=scorer, vision=vision)
        attach_control(experiment, control)  # flowllm ctl: this worker follows the run's control state
        if shard.spent_usd is not None:
            share_set_budget(control, shard.spent_usd, shard.of)
        return await experiment.run(tasks)


def share_set_budget(control: RunControl, spent_before: float, workers: int) -> None:
    """A Ray worker holds its share of a budget set while the run runs (it sees its own ledger only)."""
    whole = control.on_budget
    if whole is not None:
        control.on_budget = lambda cost_usd: whole(cost_share(cost_usd, spent_before, workers))


def run_shard(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Worker mode: run this worker's tasks into ``run_dir``; no progress display, no summary."""
    shard = Shard.load(cfg.experiment.worker_shard)
    if not sys.platform.startswith("linux"):
        _watch_parent(shard.parent_pid)
    parts = prepare(cfg)
    by_id = {t.task_id: t for t in parts.tasks}
    missing = [t for t in shard.task_ids if t not in by_id]
    if missing:
        raise ConfigError(f"worker {shard.index}: task {missing[0]!r} is not in the dataset any more")
    tasks = [by_id[t] for t in shard.task_ids]
    # experiment.max_concurrent stays the whole run's: this worker runs its part of it (RunControl: its share).
    control = RunControl(run_dir, parts.experiment.max_concurrent, shard.index, shard.of)
    concurrent = share(parts.experiment.max_concurrent, shard.index, shard.of)
    parts.experiment = replace(parts.experiment, max_concurrent=concurrent)
    if shard.budget is not None:  # a Ray worker sees its own ledger only: it holds its share of the budget
        parts.experiment = replace(parts.experiment, budget=RunBudget(**shard.budget))
    secrets = provider_secrets(parts.provider_cfg, resolve=parts.providers)
    recorder = Recorder(run_dir, snapshot=cfg.recorder.snapshot, secrets=secrets)
    # telemetry.otlp_endpoint: each worker sends its own tasks' spans
    telemetry = attach_telemetry(telemetry_endpoint(cfg), recorder, protocol=parts.provider_cfg.protocol)
    ledger = UsageLedger(RunLayout(run_dir).ledger, prices=parts.prices, user=cfg.experiment.get("user"))
    interrupted = True
    try:
        interrupted = asyncio.run(_run_shard_async(cfg, parts, tasks, shard, recorder, ledger, control)).interrupted
    except KeyboardInterrupt:  # a second Ctrl-C: what finished is on disk
        pass
    finally:
        if telemetry is not None:
            telemetry.close()
        recorder.close()
        ledger.close()
    return {"interrupted": interrupted, "worker": shard.index}


# ----- the parent ------------------------------------------------------------------------------------------
def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def worker_base_command(hydra_cfg: Any, run_dir: Path) -> list[str]:
    """The command line of a worker without its shard: the parent's app, config and overrides, into the
    parent's folder."""
    command = [sys.executable, "-m", "flowllm", "--config-name", str(hydra_cfg.job.config_name)]
    for source in hydra_cfg.runtime.config_sources:
        if source.provider == "command-line":
            command += ["--config-dir", str(source.path).removeprefix("file://")]
    # Unresolved: an override may hold ${workspace}, which only a task's folder resolves.
    task = [str(o) for o in OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False) or []]
    hydra = [str(o) for o in OmegaConf.to_container(hydra_cfg.overrides.hydra, resolve=False) or []]
    command += [o for o in task if _override_key(o) != SHARD_KEY]
    command += [o for o in hydra if not _override_key(o).startswith(_PARENT_ONLY)]
    command += [
        f"hydra.run.dir={quoted(str(run_dir.resolve()))}",
        "hydra.output_subdir=null",  # the parent's .hydra/ is the run's config
        f"hydra.job.name={quoted(str(hydra_cfg.job.name))}",  # the same log file as the parent's
    ]
    return command


def worker_command(hydra_cfg: Any, run_dir: Path, shard_path: Path) -> list[str]:
    """The command line of one worker (``worker_base_command`` and its shard file)."""
    return [*worker_base_command(hydra_cfg, run_dir), shard_override(shard_path)]


@dataclass
class ResultWatcher:
    """New ``result.json`` files of the tasks being run: what the progress display and the summary count.

    A file there before the run started (a failed task being rerun, or any task under resume=false) only
    counts once it has been replaced (the recorder writes it by rename: a new inode). It is read as a resume
    reads one (``read_outcome`` with the task and the scorer's rules): a file of another task does not count,
    and ``correct`` is recomputed from the answer and the dataset."""

    layout: RunLayout
    rescore: RuleScore | None = None
    pending: dict[str, tuple[int, int, int] | None] = field(default_factory=dict)
    outcomes: dict[str, TaskOutcome] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)

    @staticmethod
    def _signature(path: Path) -> tuple[int, int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def watch(self, tasks: list[Task]) -> None:
        for task in tasks:
            self.tasks[task.task_id] = task
            self.pending[task.task_id] = self._signature(self.layout.result(task.task_id))

    def poll(self) -> list[TaskOutcome]:
        found = []
        for task_id, before in list(self.pending.items()):
            path = self.layout.result(task_id)
            now = self._signature(path)
            if now is None or now == before:
                continue
            outcome = read_outcome(path, self.tasks[task_id], self.rescore)
            if outcome is not None:
                del self.pending[task_id]
                self.outcomes[task_id] = outcome
                found.append(outcome)
        return found


@dataclass
class _Pool:
    """The running workers, and how the run around them is going."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    signals: int = 0  # SIGINT/SIGTERM received (and forwarded)
    failure: str | None = None

    def forward(self, signum: int, frame: FrameType | None = None) -> None:
        self.signals += 1
        self.send(signal.SIGINT)

    def send(self, signum: int) -> None:
        for proc in self.procs:
            proc.send_signal(signum)  # a no-op for one that has exited

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def check(self) -> None:
        """A worker that failed on its own (not after our SIGINT) stops the run: its peers are interrupted."""
        if self.failure is not None or self.signals:
            return
        for index, proc in enumerate(self.procs):
            code = proc.poll()
            if code not in (None, 0):
                self.failure = f"worker {index + 1} of {len(self.procs)} exited with code {code}"
                self.send(signal.SIGINT)
                return


def scorer_rules(cfg: DictConfig, run_dir: Path) -> RuleScore | None:
    """The run's scorer's rules, taken from the scorer as ``Experiment.previous_outcome`` takes them: what the
    parent recomputes ``correct`` with when it reads a ``result.json``. A judge has none (its verdicts are read as
    its workers saved them), and its provider is not opened here."""
    if str(cfg.dataset.scorer) == JudgeScorer.name:
        return None

    async def rules() -> RuleScore | None:
        async with open_scorer(str(cfg.dataset.scorer), run_dir=run_dir) as scorer:
            return scorer.rules

    return asyncio.run(rules())


def run_parallel(cfg: DictConfig, run_dir: Path, workers: int) -> dict[str, Any]:
    """The parent of a run with ``experiment.workers`` > 1; returns the summary (as ``app.run`` does)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        hydra_cfg = HydraConfig.get()
    except ValueError:
        raise ConfigError("experiment.workers above 1 needs the app (python -m flowllm)") from None
    parts = prepare(cfg)
    tasks: list[Task] = parts.tasks
    started = time.perf_counter()
    layout = RunLayout(run_dir)
    ray, workers = _connect_ray(cfg, run_dir, workers)
    rescore = scorer_rules(cfg, run_dir)
    already = _finished_before(cfg, layout, tasks, rescore)
    todo_tasks = [t for t in tasks if t.task_id not in already]
    todo = [t.task_id for t in todo_tasks]
    # No more workers than tasks to run, nor than tasks allowed at once (max_concurrent is the whole run's).
    count = min(workers, len(todo), parts.experiment.max_concurrent)
    if count > 1:
        check_in_flight(parts.provider_cfg, parts.providers, count)
    secrets = provider_secrets(parts.provider_cfg, resolve=parts.providers)
    run_dir.mkdir(parents=True, exist_ok=True)
    layout.ledger.open("ab").close()  # the workers append to it; an empty run still has one
    watcher = ResultWatcher(layout, rescore)
    watcher.watch(todo_tasks)
    # Tokens and cost follow every worker's calls: the bar reads the run's one ledger as the workers append to it.
    projector = Projector(SpendBook.of_run(run_dir), parts.experiment.budget)
    progress = ProgressReporter(
        enabled=bool(cfg.progress),
        ledger=LedgerTail(layout.ledger),
        judge_ledger=LedgerTail(layout.judge_ledger),
        interval_s=float(cfg.experiment.get("progress_interval_s", 10.0)),
        projector=projector,
    )
    progress.start(total=len(tasks), already=list(already.values()))
    # A 429 met by one worker pauses the others too: its pause goes through a file per provider (limiter.py).
    shared_pauses = layout.root / ".rate_limit_pauses"
    pool: _Pool | RayPool = _Pool() if ray is None else RayPool(ray, run_dir)
    handlers = {s: signal.signal(s, pool.forward) for s in (signal.SIGINT, signal.SIGTERM)}
    # flowllm ctl RUN ...: answered here, followed by every worker (flowllm/setup/steering.py)
    desk = ControlDesk(run_dir, workers=count, failed=requeue_check(run_dir, tasks), stop=lambda: pool.forward(0))
    adaptive = adaptive_limits(parts.experiment, workers=count, shared_dir=shared_pauses)
    progress.concurrency = shown = concurrency_text(parts.experiment, adaptive, desk)
    desk.status = lambda: {"total": progress.total, "done": progress.done, "concurrency": shown()}
    try:
        desk.open()
        # The shard files live in the run's control folder, not in /tmp: gone with it at the end, and replaced
        # by the next session's when a SIGKILL left them.
        shutil.rmtree(desk.paths.shards, ignore_errors=True)
        desk.paths.shards.mkdir()
        budget = parts.experiment.budget
        _start_workers(pool, hydra_cfg, run_dir, deal(todo, count), desk.paths.shards, shared_pauses, budget)
        _follow_workers(pool, watcher, progress, desk, {t.task_id: t for t in todo_tasks})
    finally:
        desk.close()
        progress.stop()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    if desk.state.cost_usd is not None:  # set while the run ran: the summary's budget is the one that applied
        parts.experiment.budget = replace(parts.experiment.budget, cost_usd=desk.state.cost_usd)
    # Tasks the run's budget left unstarted are not an interruption (the summary's budget block says so), nor, in
    # a replay, those the saved run's budget left unstarted.
    stops = SavedStops.of_replay(parts.provider_cfg)
    left = [t for t in watcher.pending if stops is None or not stops.stopped_before(t)]
    pending = bool(left) and not budget_spent(parts.experiment.budget, run_dir)
    interrupted = pool.signals > 0 or pool.failure is not None or pending
    outcomes = [
        already.get(t.task_id)
        or watcher.outcomes.get(t.task_id)
        # Not started again (the budget is spent): an earlier session's budget stop is still the folder's record.
        or stopped_by_budget(layout.result(t.task_id), t, rescore)
        for t in tasks
    ]
    finished = [o for o in outcomes if o is not None]
    # The same summary as a one-process run's, built by the same function.
    result = RunResult(finished, interrupted, len(already), tools_unavailable=None, tools_start_s=None)
    summary = run_summary(cfg, parts, result, run_dir, wall_seconds=time.perf_counter() - started)
    return _write_summary(summary, finished, layout, secrets, pool.failure)


def _follow_workers(
    pool: _Pool | RayPool, watcher: ResultWatcher, progress: ProgressReporter, desk: ControlDesk, todo: dict[str, Task]
) -> None:
    """Until the workers end: results counted as they appear, ``flowllm ctl`` answered, a failed worker stops the
    rest. A requeued task's next result counts again."""
    looked, requeued = 0.0, 0
    while pool.alive():
        with contextlib.suppress(OSError):
            desk.poll()
        for task_id in desk.state.requeue[requeued:]:
            if task_id in todo:
                watcher.watch([todo[task_id]])
            if task_id in watcher.outcomes:
                progress.requeued(watcher.outcomes.pop(task_id))
        requeued = len(desk.state.requeue)
        if time.monotonic() - looked >= POLL_S:
            looked = time.monotonic()
            for outcome in watcher.poll():
                progress.task_done(outcome)
            pool.check()
        time.sleep(CONTROL_POLL_S)
    for outcome in watcher.poll():
        progress.task_done(outcome)


def _connect_ray(cfg: DictConfig, run_dir: Path, workers: int) -> tuple[Any, int]:
    """With ``experiment.executor=ray``: the cluster, checked to see the run directory, and the worker count
    (``auto``: the cluster's CPUs); else ``(None, workers)``."""
    if str(cfg.experiment.get("executor", "local")) != "ray":
        return None, workers
    from flowllm.experiment import ray_executor

    ray = ray_executor.connect(cfg.experiment.get("ray_address"))
    if str(cfg.experiment.get("workers")).strip().lower() == "auto":
        workers = min(MAX_WORKERS, ray_executor.cluster_cpus(ray))
    return ray, workers


def _finished_before(
    cfg: DictConfig, layout: RunLayout, tasks: list[Task], rescore: RuleScore | None
) -> dict[str, TaskOutcome]:
    """The tasks a resumed run need not run again. Read as a one-process resume reads them
    (Experiment.previous_outcome): the task's own folder, the file checked to be that task's, and its score
    recomputed, so a forged result.json cannot raise the accuracy."""
    already: dict[str, TaskOutcome] = {}
    if not cfg.experiment.resume:
        return already
    for task in tasks:
        previous = read_outcome(layout.result(task.task_id), task, rescore)
        # An answer that could not be scored goes to a worker all the same: it scores it again (or reruns the
        # epochs that could not be scored), as a one-process resume does.
        if previous is not None and previous.status in FINISHED and not previous.scored_again:
            already[task.task_id] = previous
    return already


def _start_workers(
    pool: _Pool | RayPool,
    hydra_cfg: Any,
    run_dir: Path,
    shards: list[list[str]],
    scratch: Path,
    shared_pauses: Path,
    budget: RunBudget,
) -> None:
    """One worker per shard: a local process, or a Ray task that writes its shard file on its node."""
    for index, shard_ids in enumerate(shards):
        shard = Shard(index, len(shards), shard_ids, os.getpid())
        if isinstance(pool, RayPool):
            shard.budget = budget_share(budget, run_dir, len(shards))
            shard.spent_usd = SpendBook.of_run(run_dir).total().cost_usd
            pool.start(worker_base_command(hydra_cfg, run_dir), dict(shard.__dict__))
            continue
        shard_path = scratch / f"shard-{index}.json"
        shard.save(shard_path)
        pool.procs.append(
            subprocess.Popen(
                worker_command(hydra_cfg, run_dir, shard_path),
                env={**os.environ, SHARED_PAUSES_ENV: str(shared_pauses)},
                preexec_fn=die_with(os.getpid()),
                process_group=0,  # a terminal's Ctrl-C reaches the parent only, which forwards it once
            )
        )


def _write_summary(
    summary: RunSummary, finished: list[TaskOutcome], layout: RunLayout, secrets: list[str], failure: str | None
) -> dict[str, Any]:
    """Writes the parent's summary, prints it, and raises ``RunStopped`` when a worker failed."""
    if summary.tools is not None:  # run_python's sandbox was probed by the workers, not here: not known
        summary.tools.sandbox_gaps = None
    if failure is not None:
        summary.status, summary.error = "failed", failure
    try:
        atomic_write(layout.summary, Redactor(secrets).dumps(summary.to_dict()))
    except RecordError as exc:  # tasks ran: a run error, whose exit code the tasks decide (never 2)
        summary.status, summary.error = "failed", str(exc)
        raise RunStopped(str(exc), summary.to_dict()) from exc
    print_run_tables(summary, finished, layout.root)
    if failure is not None:
        message = f"{failure} (its message is above); finished tasks are saved: rerun to resume"
        raise RunStopped(message, summary.to_dict())
    return summary.to_dict()
