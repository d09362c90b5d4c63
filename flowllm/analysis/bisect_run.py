"""``inspect bisect A B``: read both runs, plan the forks (flowllm/analysis/attribution.py), project their cost,
run them (``python -m flowllm provider=replay provider.run_dir=A provider.fork=live`` with one setting changed,
on the planned tasks only: each task replays A's turns and goes live from its first differing request) and
attribute the observed difference to the settings.

A fork's folder is ``OUT/<setting>``; a second bisect into the same ``OUT`` resumes them (nothing runs again).
The attribution is saved as ``OUT/bisect.json`` (``BisectReport.to_dict``): ``flowllm inspect report OUT`` shows
it above the forks (``bisect_rows``).
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from flowllm.analysis.attribution import Change, Effect, Plan, changed_settings, effects, pick_tasks
from flowllm.analysis.epoch_runs import NoRun, read_results, task_costs
from flowllm.analysis.scale_report import NoCommonTask
from flowllm.errors import CliError
from flowllm.run.stats import score_map
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import RunSummary
from flowllm.setup.fingerprint import flatten, read_fingerprint

__all__ = ["BISECT_FILE", "BisectOptions", "BisectReport", "OverBudget", "bisect", "bisect_rows"]

BISECT_FILE = "bisect.json"  # in OUT, beside the forks


class OverBudget(CliError):
    """The forks' projected cost is over ``--max-cost``: nothing ran (exit status 2)."""


class ForkFailed(CliError):
    """A fork's run ended with an error: its last line is the message (exit status 1)."""

    exit_code = 1


@dataclass(frozen=True)
class BisectOptions:
    out: Path
    sample: int = 5
    seed: int = 0
    max_cost: float | None = None
    dry_run: bool = False
    shown: tuple[str, str] | None = None  # how A and B were given (a bundle's file), when not the folders read


@dataclass
class BisectReport:
    a: Path
    b: Path
    plan: Plan
    changes: list[Change]
    left_out_settings: list[str]
    tasks_only_in: dict[str, list[str]]
    projected_cost_usd: float | None
    observed: float = 0.0
    effects: list[Effect] = field(default_factory=list)
    spent: dict[str, Any] = field(default_factory=dict)
    forks: dict[str, str] = field(default_factory=dict)

    @property
    def interaction(self) -> float:
        return self.observed - math.fsum(e.effect for e in self.effects)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": str(self.a),
            "b": str(self.b),
            "tasks": len(self.plan.common),
            "tasks_only_in": self.tasks_only_in,
            "differing_tasks": self.plan.differing,
            "sampled_tasks": self.plan.sampled,
            "settings_forked": [{"setting": c.name, "overrides": list(c.overrides)} for c in self.changes],
            "settings_left_out": self.left_out_settings,
            "projected_cost_usd": self.projected_cost_usd,
            "observed": self.observed,
            "effects": [e.to_dict() for e in self.effects],
            "interaction": self.interaction if self.effects else None,
            "interval": "normal, at the Bonferroni level 1 - 0.05/m; p values Holm-adjusted",
            "spent": self.spent,
            "forks": self.forks,
        }


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}


def _choices(run: Path) -> dict[str, str]:
    """The run's config-group choices: Hydra's record, or (a bundle leaves Hydra's settings out) the groups its
    command line chose (``repair=none``; a group left at its default is then compared key by key)."""
    data = _yaml(RunLayout(run).hydra)
    choices = ((data.get("hydra") or {}).get("runtime") or {}).get("choices") or {}
    if not choices and not RunLayout(run).hydra.is_file():
        given = _yaml(RunLayout(run).overrides)
        pairs = (str(o).lstrip("+").split("=", 1) for o in given if isinstance(o, str) and "=" in o)
        choices = {k: v for k, v in pairs if k.isidentifier() and not v.startswith(("[", "{"))}
    return {str(k): str(v) for k, v in choices.items() if not str(k).startswith("hydra/")}


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def plan_bisect(a: Path, b: Path, options: BisectOptions) -> BisectReport:
    """What would run, and its projected cost; raises ``NoRun`` and ``NoCommonTask``."""
    prints = {run: read_fingerprint(run) for run in (a, b)}
    for run, fp in prints.items():
        if fp is None:
            raise NoRun(f"{run} has no fingerprint.json: bisect needs two run folders that recorded their settings")
    fa, fb = prints[a], prints[b]
    assert fa is not None and fb is not None
    raw_b = flatten(_yaml(RunLayout(b).config))
    changes, left_out = changed_settings(
        fa.settings, fb.settings, (_choices(a), _choices(b)), raw_b, fa.dataset_files != fb.dataset_files
    )
    sa, sb = score_map(read_results(a)), score_map(read_results(b))
    plan = pick_tasks(sa, sb, options.sample, options.seed)
    if not plan.common:
        raise NoCommonTask(f"the runs have no scored task in common ({len(sa)} in A, {len(sb)} in B)")
    only = {"a": sorted(set(sa) - set(sb)), "b": sorted(set(sb) - set(sa))}
    costs = task_costs(a)
    per_fork = [costs.get(t, 0.0) for t in plan.tasks]
    projected = None if any(c is None for c in per_fork) else len(changes) * math.fsum(c or 0.0 for c in per_fork)
    shown_a, shown_b = options.shown or (str(a), str(b))
    report = BisectReport(
        Path(shown_a), Path(shown_b), plan, changes, left_out, {k: v for k, v in only.items() if v}, projected
    )
    report.observed = math.fsum(sb[t] - sa[t] for t in plan.common) / len(plan.common)
    return report


def _own_overrides(a: Path, change: Change) -> list[str]:
    """A's command line, so that its fork differs from A in ``change`` only (a sweep's job was run with the
    sweep's settings): all of it but Hydra's, the provider's (the fork's is the replay), the task selection and
    progress (the fork sets them) and what ``change`` sets."""
    given = _yaml(RunLayout(a).overrides)
    kept = []
    for override in given if isinstance(given, list) else []:
        key = str(override).lstrip("+~").split("=", 1)[0]
        head = re.split(r"[./]", key, maxsplit=1)[0]
        if head in ("hydra", "provider", "progress") or key == "dataset.task_ids":
            continue
        if key == change.name or key in change.keys or ("." not in change.name and head == change.name):
            continue
        kept.append(str(override))
    return kept


def fork_command(a: Path, provider: str, change: Change, tasks: Sequence[str], out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "flowllm",
        *_own_overrides(a, change),
        "provider=replay",
        f"provider.run_dir={a}",
        "provider.fork=live",
        f"provider.live={provider}",
        *change.overrides,
        f"dataset.task_ids=[{','.join(tasks)}]",
        "progress=false",
        f"hydra.run.dir={out}",
    ]


async def _run(command: list[str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    return proc.returncode or 0, err.decode("utf-8", "replace")


async def _run_forks(commands: Sequence[list[str]]) -> list[tuple[int, str]]:
    return list(await asyncio.gather(*(_run(c) for c in commands)))


def _summary(run: Path) -> RunSummary:
    try:
        return RunSummary.from_dict(orjson.loads(RunLayout(run).summary.read_bytes()))
    except (OSError, orjson.JSONDecodeError):
        return RunSummary.from_dict({})


def _spent(summaries: Mapping[str, RunSummary]) -> dict[str, Any]:
    calls = sum(int(s.fork.live_calls or 0) for s in summaries.values() if s.fork is not None)
    costs = [s.fork.live_cost_usd if s.fork is not None else None for s in summaries.values()]
    known = None if any(c is None for c in costs) else math.fsum(float(c or 0.0) for c in costs)
    return {"live_calls": calls, "live_cost_usd": known}


def bisect(a: Path, b: Path, options: BisectOptions) -> BisectReport:
    """Plan, check the projection against ``max_cost``, run the forks and attribute the difference."""
    report = plan_bisect(a, b, options)
    if options.max_cost is not None and (report.projected_cost_usd or 0.0) > options.max_cost:
        shown = "not known" if report.projected_cost_usd is None else f"${report.projected_cost_usd:.4f}"
        raise OverBudget(
            f"the forks would cost {shown} ({len(report.changes)} settings x {len(report.plan.tasks)} tasks, "
            f"priced from A's ledger), over --max-cost ${options.max_cost:.4f}: nothing ran"
        )
    if options.dry_run or not report.changes:
        return report
    provider = _choices(a).get("provider", "offline")
    outs = {c.name: options.out / _slug(c.name) for c in report.changes}
    commands = [fork_command(a, provider, c, report.plan.tasks, outs[c.name]) for c in report.changes]
    for change, (code, err) in zip(report.changes, asyncio.run(_run_forks(commands)), strict=True):
        if code != 0:
            last = next((line for line in reversed(err.splitlines()) if line.strip()), f"exit status {code}")
            raise ForkFailed(f"the fork for {change.name} failed ({outs[change.name]}): {last}")
    forks = [score_map(read_results(outs[c.name])) for c in report.changes]
    sa = score_map(read_results(a))
    report.effects = effects(report.plan, report.changes, sa, forks)
    summaries = {c.name: _summary(outs[c.name]) for c in report.changes}
    report.spent = _spent(summaries)
    report.forks = {name: str(path) for name, path in outs.items()}
    (options.out / BISECT_FILE).write_bytes(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2))
    return report


def bisect_rows(folder: Path) -> dict[str, Any] | None:
    """The HTML report's bisect card for a bisect's ``OUT`` folder (None without its ``bisect.json``)."""
    try:
        data = orjson.loads((folder / BISECT_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None

    def points(value: float | None) -> str:
        return "not known" if value is None else f"{100 * value:+.1f}"

    rows = [
        [
            e["setting"],
            " ".join(e["overrides"]),
            points(e["effect"]),
            "not known" if e["ci"] is None else f"[{100 * e['ci'][0]:+.1f}, {100 * e['ci'][1]:+.1f}]",
            "not known" if e["p_holm"] is None else f"{e['p_holm']:.3g}",
            f"{e['fixed']} / {e['broken']}",
        ]
        for e in data["effects"]
    ]
    spent = data["spent"]
    cost = spent.get("live_cost_usd")
    note = (
        f"A: {data['a']}; B: {data['b']}; {data['tasks']} common tasks, forked on {len(data['differing_tasks'])} "
        f"differing and {len(data['sampled_tasks'])} sampled; observed B - A {points(data['observed'])} points = "
        f"effects + interaction {points(data['interaction'])}; spent "
        f"{'not known' if cost is None else f'${cost:.4f}'} on {spent.get('live_calls', 0)} live calls"
    )
    columns = ["setting", "override", "effect (points)", "interval", "p (Holm)", "fixed / broken"]
    return {"columns": columns, "rows": rows, "note": note}
