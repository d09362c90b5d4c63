"""A sweep (``-m``) checked as a whole before its first job starts.

Every job's config is composed as Hydra will compose it (the basic sweeper's cartesian product of the swept
values) and put through the checks that need no server: its settings, the pipeline, the provider and every
fallback with their keys, the dataset, the judge, the price table, the run's resume mode. Every problem is
listed once, one line each, naming the jobs it stops when not all of them; then the sweep exits 2 and no job
has started. What needs a server (a provider answering, a tool server starting) is checked by each job's
own preflight when it starts.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from flowllm.cli.config_check import CONFIG_DIR, CONFIG_NAME, split_command_line
from flowllm.errors import FlowError

# A problem found in this many jobs or more is said with a count rather than every job's number.
MAX_NAMED_JOBS = 6


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The overrides of each job of the sweep, in Hydra's job order (job 0 first)."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def job_problems(overrides: Sequence[str]) -> list[str]:
    """What stops one job before any server is needed (empty: it may start)."""
    from flowllm.app import prepare_parts
    from flowllm.experiment.fingerprint import resume_mode
    from flowllm.scoring.rejudge import inherit_replayed_run

    try:
        cfg = compose(CONFIG_NAME, overrides=list(overrides))
        cfg = inherit_replayed_run(cfg)
        resume_mode(cfg.experiment.resume)
    except FlowError as exc:
        return str(exc).splitlines()
    except Exception as exc:  # a composition error: the command-line check said it already, one line
        return [str(exc).splitlines()[0] if str(exc) else type(exc).__name__]
    _, _, problems = prepare_parts(cfg)
    return problems


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
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        for number, job in enumerate(jobs):
            # What tells the job apart: its values of the swept overrides.
            labels.append(" ".join(o for o in job if o.split("=", 1)[0].lstrip("+~") in swept) or "-")
            for problem in job_problems(job):
                found.setdefault(problem, []).append(number)
    return [
        problem if len(numbers) == len(jobs) else f"{problem} ({_jobs_text(numbers, len(jobs), labels)})"
        for problem, numbers in found.items()
    ]
