"""A sweep (``-m``) checked as a whole before its first job starts.

Every job's config is composed as Hydra will compose it (the basic sweeper's cartesian product of the swept
values) and put through the checks that need no server: its settings, the pipeline, the provider and every
fallback with their keys, the dataset, the judge, the price table, the run's resume mode. When all of that is
sound, every distinct real provider of the sweep (fallbacks included) is asked once for its models, as a job's
preflight would. Every problem is listed once, one line each, naming the jobs it stops when not all of them;
then the sweep exits 2 and no job has started. Tool servers are started by each job's own preflight.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from flowllm.app import preflight_targets, prepare_parts
from flowllm.cli.config_check import CONFIG_DIR, CONFIG_NAME, split_command_line
from flowllm.errors import FlowError
from flowllm.experiment.fingerprint import resume_mode
from flowllm.experiment.preflight import ProviderTarget, check_providers, live_providers
from flowllm.scoring.rejudge import inherit_replayed_run

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


def check_job(overrides: Sequence[str]) -> JobCheck:
    """What stops one job before any server is needed (no problems: it may start)."""
    try:
        cfg = compose(CONFIG_NAME, overrides=list(overrides))
        cfg = inherit_replayed_run(cfg)
        resume_mode(cfg.experiment.resume)
    except FlowError as exc:
        return JobCheck(str(exc).splitlines())
    except Exception as exc:  # a composition error: the command-line check said it already, one line
        return JobCheck([str(exc).splitlines()[0] if str(exc) else type(exc).__name__])
    parts, _, problems = prepare_parts(cfg)
    if problems or parts is None or not cfg.preflight.providers:
        return JobCheck(problems)
    return JobCheck([], live_providers(preflight_targets(parts.provider_cfg)), float(cfg.preflight.timeout_s))


def _target_key(target: ProviderTarget) -> tuple[Any, ...]:
    cfg = target.cfg
    return (target.id, cfg.protocol, cfg.base_url, cfg.api_key_env, cfg.auth)


async def _reach(targets: dict[tuple[Any, ...], tuple[ProviderTarget, float]]) -> dict[tuple[Any, ...], list[str]]:
    """Each distinct provider of the sweep asked once for its models (as a job's preflight does)."""
    keys = list(targets)
    found = await asyncio.gather(*(check_providers([targets[k][0]], targets[k][1]) for k in keys))
    return dict(zip(keys, found, strict=True))


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
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        for number, job in enumerate(jobs):
            # What tells the job apart: its values of the swept overrides.
            label = " ".join(o for o in job if o.split("=", 1)[0].lstrip("+~") in swept)
            labels.append(_UNESCAPE.sub(r"\1", label) or "-")
            checked = check_job(job)
            for problem in checked.problems:
                found.setdefault(problem, []).append(number)
            for target in checked.targets:
                targets.setdefault(_target_key(target), (target, checked.timeout_s))
                users.setdefault(_target_key(target), []).append(number)
    if not found and targets:  # every job's settings are sound: is every real provider of the sweep there?
        for key, problems in asyncio.run(_reach(targets)).items():
            for problem in problems:
                found.setdefault(problem, []).extend(users[key])
    return [
        problem if len(numbers) == len(jobs) else f"{problem} ({_jobs_text(numbers, len(jobs), labels)})"
        for problem, numbers in found.items()
    ]
