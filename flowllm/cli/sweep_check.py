"""A sweep (``-m``) checked as a whole before its first job starts.

Every job's config is composed as Hydra will compose it (the basic sweeper's cartesian product of the swept
values) and put through the checks that need no server: its settings, the pipeline, the provider and every
fallback with their keys, the dataset, the judge, the price table, the run's resume mode, and the job's folder
(``hydra.sweep.dir``/``subdir``: one holding results of other settings refuses the job, as the job's own
fingerprint check would once earlier jobs had run). When all of that is
sound, every distinct real provider of the sweep (fallbacks included) is asked once for its models, and the tool
servers of every distinct tool configuration are started once (in the web tool environment a run gives them) and
stopped, as a job's preflight would. ``sweep.baseline`` must name one job, matched as the end-of-sweep
comparison will match it. Every problem is listed once, one line each, naming the jobs it stops when not all of
them; then the sweep exits 2 and no job has started.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from flowllm.config.check import CONFIG_DIR, CONFIG_NAME, split_command_line
from flowllm.config.plain import plain_config
from flowllm.core.scratch import scratch as scratch_folder
from flowllm.errors import ConfigError, FlowError
from flowllm.setup import fingerprint
from flowllm.setup.build import preflight_targets, prepare_parts, resolve_path
from flowllm.setup.fingerprint import resume_mode
from flowllm.setup.preflight import (
    ProviderTarget,
    check_providers,
    check_tools,
    live_providers,
    tool_start_timeout,
)
from flowllm.setup.rejudge import inherit_replayed_run
from flowllm.setup.webconf import web_tools
from flowllm.sweep.stats import resolve_baseline
from flowllm.tools import load_settings

# Hydra escapes the sweep's values (http\://...): shown as the user wrote them.
_UNESCAPE = re.compile(r"\\(.)")
# A problem found in this many jobs or more is said with a count rather than every job's number.
MAX_NAMED_JOBS = 6


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The overrides of each job of the sweep, in Hydra's job order (the basic sweeper's cartesian product: the
    first swept override varies slowest; job 0 first)."""
    choices: list[list[str]] = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if not override.is_sweep_override():
            choices.append([str(override.input_line)])
            continue
        # The key element keeps the override's +, ++ or ~.
        choices.append([f"{override.get_key_element()}={v}" for v in override.sweep_string_iterator()])
    return [list(job) for job in itertools.product(*choices)]


@dataclass
class JobCheck:
    """One job's problems that need no server, and the providers its preflight would reach."""

    problems: list[str]
    targets: list[ProviderTarget] = field(default_factory=list)
    timeout_s: float = 30.0
    tools: DictConfig | None = None  # the job's config when its preflight starts tool servers
    baseline: str | None = None  # the job's sweep.baseline (None: unset, or the config did not compose)


def job_folder(composed: DictConfig, number: int) -> Path | None:
    """The folder job ``number`` will run in, as Hydra's launchers name it (``hydra.sweep.dir`` and its
    ``subdir``); None when it cannot be known before the job starts (a resolver only the job has)."""
    hydra = composed.hydra
    with open_dict(hydra):
        hydra.job.num = hydra.job.id = number
    try:
        return Path(str(hydra.sweep.dir)) / str(hydra.sweep.subdir)
    except Exception:  # the job's own guard still checks its folder before it runs
        return None


def _without_hydra(composed: DictConfig) -> DictConfig:
    cfg = composed.copy()
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def check_job(overrides: Sequence[str], number: int = 0) -> JobCheck:
    """What stops one job before any server is needed (no problems: it may start)."""
    try:
        composed = compose(CONFIG_NAME, overrides=list(overrides), return_hydra_config=True)
        folder = job_folder(composed, number)
        cfg = inherit_replayed_run(_without_hydra(composed))
        resume_mode(cfg.experiment.resume)
    except FlowError as exc:
        return JobCheck(str(exc).splitlines())
    except Exception as exc:  # a composition error: the command-line check said it already, one line
        return JobCheck([str(exc).splitlines()[0] if str(exc) else type(exc).__name__])
    baseline = None if cfg.sweep.baseline is None else str(cfg.sweep.baseline)
    parts, _, problems = prepare_parts(cfg)
    if not problems and folder is not None:
        assert parts is not None  # prepared without a problem
        problems = folder_problems(cfg, folder, [task.task_id for task in parts.tasks])
    if problems or parts is None:
        return JobCheck(problems, baseline=baseline)
    targets = live_providers(preflight_targets(parts.provider_cfg, parts.providers)) if cfg.preflight.providers else []
    starts_tools = bool(cfg.preflight.tools and cfg.tools.get("servers"))
    return JobCheck([], targets, float(cfg.preflight.timeout_s), cfg if starts_tools else None, baseline)


def folder_problems(cfg: DictConfig, folder: Path, selected: Sequence[str]) -> list[str]:
    """Why the job's folder refuses it (it holds results of other settings, or of tasks the job leaves out), as its
    own run would say it."""
    try:
        fingerprint.check(cfg, folder, resolve_path(cfg.dataset.path, "dataset.path"), setting="hydra.sweep.dir")
        fingerprint.check_selection(folder, selected, setting="hydra.sweep.dir")
    except FlowError as exc:
        return str(exc).splitlines()
    return []


def baseline_problem(baseline: str | None, jobs: Sequence[Sequence[str]]) -> str | None:
    """Why ``sweep.baseline`` names no job (or several) of the sweep, None when it names one. The jobs are
    matched as the sweep summary matches them: by folder (``hydra.sweep.subdir`` is the job's number), position
    or one of the job's own overrides (Hydra's settings are not among them)."""
    named = [(str(n), [o for o in job if not o.lstrip("+~").startswith("hydra.")]) for n, job in enumerate(jobs)]
    try:
        resolve_baseline(baseline, named)
    except ConfigError as exc:
        return str(exc)
    return None


def _target_key(target: ProviderTarget) -> tuple[Any, ...]:
    cfg = target.cfg
    return (target.id, cfg.protocol, cfg.base_url, cfg.api_key_env, cfg.auth)


def tools_key(cfg: DictConfig, start_timeout_s: float) -> str:
    """What decides whether a job's tool servers start: its resolved tools settings, the start timeout, and what
    the run's web tool environment (flowllm.setup.webconf) reads from the rest of the config."""
    what: dict[str, Any] = {"tools": OmegaConf.to_container(cfg.tools, resolve=True), "timeout_s": start_timeout_s}
    if OmegaConf.select(cfg, "tools.audio.emulator", default=False):
        what["emulator_script"] = OmegaConf.select(cfg, "provider.emulator_script")
    if OmegaConf.select(cfg, "provider.protocol") == "replay":
        what["replay"] = [OmegaConf.select(cfg, key) for key in ("provider.run_dir", "provider.fork", "replay.tools")]
    return json.dumps(what, sort_keys=True, default=str)


async def start_tools(cfg: DictConfig, start_timeout_s: float) -> list[str]:
    """One job's tool servers started and stopped, as its preflight would (same catalog, same start timeout), in
    the web tool environment a run gives them, with a scratch folder for the run's."""
    try:
        with scratch_folder("flowllm-sweep-check-") as scratch:
            async with web_tools(cfg, scratch) as web:
                tools = web.apply(load_settings(plain_config(cfg.tools)))
                problems, _ = await check_tools(tools, start_timeout_s, warn=False)
    except FlowError as exc:
        return str(exc).splitlines()
    return problems


async def _reach(
    targets: dict[tuple[Any, ...], tuple[ProviderTarget, float]], tools: dict[str, tuple[DictConfig, float]]
) -> tuple[dict[tuple[Any, ...], list[str]], dict[str, list[str]]]:
    """Each distinct provider of the sweep asked once for its models, and each distinct tool configuration's
    servers started once (one configuration after the other: each starts its servers together)."""

    async def start_each() -> dict[str, list[str]]:
        return {key: await start_tools(cfg, timeout_s) for key, (cfg, timeout_s) in tools.items()}

    keys = list(targets)
    found, started = await asyncio.gather(
        asyncio.gather(*(check_providers([targets[k][0]], targets[k][1]) for k in keys)), start_each()
    )
    return dict(zip(keys, found, strict=True)), started


def _jobs_text(jobs: list[int], total: int, labels: list[str]) -> str:
    if len(jobs) == total:
        return "every job"
    if len(jobs) > MAX_NAMED_JOBS:
        return f"{len(jobs)} of {total} jobs"
    named = ", ".join(f"{j} ({labels[j]})" for j in jobs)
    return f"job {named}" if len(jobs) == 1 else f"jobs {named}"


def sweep_problems(argv: Sequence[str]) -> list[str]:
    """Every problem of every job of the sweep on ``argv``, each once, with the jobs it stops."""
    overrides = split_command_line(argv).overrides
    jobs = sweep_jobs(overrides)
    swept = {o.key_or_group for o in OverridesParser.create().parse_overrides(overrides) if o.is_sweep_override()}
    found: dict[str, list[int]] = {}
    labels = []
    targets: dict[tuple[Any, ...], tuple[ProviderTarget, float]] = {}
    users: dict[tuple[Any, ...], list[int]] = {}
    tools: dict[str, tuple[DictConfig, float]] = {}
    tool_users: dict[str, list[int]] = {}
    baseline: str | None = None
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        for number, job in enumerate(jobs):
            # What tells the job apart: its values of the swept overrides.
            label = " ".join(o for o in job if o.split("=", 1)[0].lstrip("+~") in swept)
            labels.append(_UNESCAPE.sub(r"\1", label) or "-")
            checked = check_job(job, number)
            baseline = baseline if baseline is not None else checked.baseline
            for problem in checked.problems:
                found.setdefault(problem, []).append(number)
            for target in checked.targets:
                targets.setdefault(_target_key(target), (target, checked.timeout_s))
                users.setdefault(_target_key(target), []).append(number)
            if checked.tools is not None:
                start_timeout_s = tool_start_timeout(checked.timeout_s)
                tools_config = tools_key(checked.tools, start_timeout_s)
                tools.setdefault(tools_config, (checked.tools, start_timeout_s))
                tool_users.setdefault(tools_config, []).append(number)
    wrong_baseline = baseline_problem(baseline, jobs)
    if wrong_baseline is not None:  # known before any job runs, not at the end of the whole sweep
        found.setdefault(wrong_baseline, []).extend(range(len(jobs)))
    if not found and (targets or tools):
        # Every job's settings are sound: is every real provider there, does every tool server start?
        reached, started = asyncio.run(_reach(targets, tools))
        for key, problems in reached.items():
            for problem in problems:
                found.setdefault(problem, []).extend(users[key])
        for tools_config, problems in started.items():
            for problem in problems:
                found.setdefault(problem, []).extend(tool_users[tools_config])
    return [
        problem if len(numbers) == len(jobs) else f"{problem} ({_jobs_text(sorted(numbers), len(jobs), labels)})"
        for problem, numbers in found.items()
    ]
