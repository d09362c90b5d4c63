"""``inspect bisect A B``'s plan and arithmetic: which settings differ between two runs (their fingerprints), the
override that changes each in a fork of A, the tasks to fork, the projected cost, and each setting's effect.

A setting is a config group whose choice differs (``repair=none``: every key under ``repair.``) or one key
(``agent.max_turns=1``); a key whose saved value interpolates another (``${agent.max_turns}``) follows it, and a
section switched on or off (``agent.compaction.enabled``) is one setting with its keys that differ. The
dataset (its settings and its files' hashes) cannot be changed by a fork: named, left out.

Each fork runs on the tasks whose score differs between A and B (stratum D, all of them) and a seeded sample S
of the others (stratum O, to catch changes that cancel). A setting's effect is the stratified mean of its paired
differences (fork - A): ``(|D| mean_D + |O| mean_S) / N`` over the N common tasks. The N tasks are themselves a
sample of the tasks the benchmark stands for, and the strata are drawn after the fact from them (two-phase
sampling, Cochran's double sampling for stratification), so the standard error has two parts: the spread of the
differences over the N tasks, ``S^2 / N`` (S^2 estimated from the strata: within ``sum_h (N_h - 1) s_h^2`` plus
between ``sum_h N_h (mean_h - effect)^2``, over N - 1), and the sampling within the strata,
``sum_h W_h^2 s_h^2 (1/n_h - 1/N_h)`` (nothing for D, forked whole). Forking every task gives the plain paired
standard error ``s / sqrt(N)``. Stratum D alone would say nothing of the spread: its tasks all flipped, most
often the same way. The intervals are at the Bonferroni level ``1 - alpha / m`` for m settings and the p values
(normal test; an exact sign test when every difference is the same) Holm-adjusted. The interaction is the
observed difference minus the sum of the effects, so the effects and the interaction add up to the observed
difference by construction.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowllm.scoring.stats import ALPHA, holm

__all__ = ["Change", "Effect", "Plan", "changed_settings", "effects", "pick_tasks"]

NOT_FORKABLE = ("dataset.",)  # what a fork of A cannot change: it replays A's tasks


@dataclass(frozen=True)
class Change:
    """One setting that differs: its name, the Hydra overrides that set B's value in a fork of A, its keys."""

    name: str
    overrides: tuple[str, ...]
    keys: tuple[str, ...]


def _derived(raw: Mapping[str, Any], key: str) -> str | None:
    """The key that ``key``'s saved value interpolates (``${agent.max_turns}``), if it is one."""
    value = raw.get(key)
    if isinstance(value, str) and value.startswith("${") and value.endswith("}") and ":" not in value:
        return value[2:-1]
    return None


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value if value and all(c.isalnum() or c in "-_./" for c in value) else repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def changed_settings(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    choices: tuple[Mapping[str, str], Mapping[str, str]],
    raw_b: Mapping[str, Any],
    dataset_files_differ: bool,
) -> tuple[list[Change], list[str]]:
    """(the settings a fork can change, the names of those it cannot) from two fingerprints' settings, the runs'
    config-group choices and B's saved config flattened as written (for its interpolations)."""
    missing = object()
    keys = sorted(k for k in set(a) | set(b) if a.get(k, missing) != b.get(k, missing))
    changes: dict[str, list[str]] = {}
    overrides: dict[str, tuple[str, ...]] = {}
    left_out = ["dataset files"] if dataset_files_differ else []
    for key in keys:
        if _derived(raw_b, key) is not None:
            continue
        if key.startswith(NOT_FORKABLE):
            left_out.append(key)
            continue
        group = key.split(".", 1)[0]
        if group != "provider" and choices[0].get(group) != choices[1].get(group) and group in choices[1]:
            changes.setdefault(group, []).append(key)
            overrides[group] = (f"{group}={choices[1][group]}",)
        elif group == "provider":
            left_out.append(key)  # the live provider of a fork is a conf/provider choice, not a key of it
        elif key in b:
            changes[key] = [key]
            overrides[key] = (f"{key}={_value(b[key])}",)
        else:
            changes[key] = [key]
            overrides[key] = (f"~{key}",)
    _fold_switched(changes, overrides)
    return [Change(name, overrides[name], tuple(ks)) for name, ks in changes.items()], sorted(set(left_out))


SWITCH = "enabled"  # the key that turns a section on (agent.compaction.enabled, memory.enabled)


def _fold_switched(changes: dict[str, list[str]], overrides: dict[str, tuple[str, ...]]) -> None:
    """A section switched on (or off) is one setting with every key of it that differs: the others act on nothing
    while it is off, and some are required once it is on (compaction's threshold)."""
    for name in [n for n in changes if n.endswith(f".{SWITCH}")]:
        section = name.removesuffix(f".{SWITCH}")
        parts = sorted(n for n in changes if n == name or n.startswith(f"{section}."))
        changes[section] = [key for part in parts for key in changes.pop(part)]
        overrides[section] = tuple(o for part in parts for o in overrides.pop(part))


@dataclass
class Plan:
    """The tasks each fork runs: those whose score differs (all) and a seeded sample of the rest."""

    common: list[str]
    differing: list[str]
    sampled: list[str]

    @property
    def tasks(self) -> list[str]:
        return sorted([*self.differing, *self.sampled])

    @property
    def others(self) -> int:
        return len(self.common) - len(self.differing)


def pick_tasks(a: Mapping[str, float], b: Mapping[str, float], sample: int, seed: int) -> Plan:
    common = sorted(set(a) & set(b))
    differing = [t for t in common if a[t] != b[t]]
    rest = [t for t in common if a[t] == b[t]]
    sampled = sorted(random.Random(seed).sample(rest, min(sample, len(rest))))
    return Plan(common, differing, sampled)


@dataclass
class Effect:
    """One setting's paired effect on accuracy (fork - A), over the common tasks."""

    change: Change
    effect: float
    stderr: float | None
    ci: list[float] | None
    p_value: float | None
    p_holm: float | None = None
    tasks: int = 0
    flipped: dict[str, int] = field(default_factory=dict)  # fixed / broken

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.change.name,
            "overrides": list(self.change.overrides),
            "keys": list(self.change.keys),
            "effect": self.effect,
            "stderr": self.stderr,
            "ci": self.ci,
            "p_value": self.p_value,
            "p_holm": self.p_holm,
            "tasks": self.tasks,
            **self.flipped,
        }


@dataclass(frozen=True)
class _Stratum:
    """One stratum's paired differences: its size among the common tasks and the differences forked in it."""

    size: int
    diffs: list[float]

    @property
    def mean(self) -> float:
        return math.fsum(self.diffs) / len(self.diffs)

    @property
    def variance(self) -> float | None:
        """The sample variance of its differences; 0 when forked whole with one task, None when not known (one
        task forked of several)."""
        n = len(self.diffs)
        if n < 2:
            return 0.0 if self.size == n else None
        return math.fsum((d - self.mean) ** 2 for d in self.diffs) / (n - 1)


def _effect(plan: Plan, base: Mapping[str, float], forked: Mapping[str, float]) -> tuple[float, float | None, int]:
    """(effect, standard error or None when not known, tasks forked): the two-phase estimator of the module's
    docstring."""
    n = len(plan.common)
    strata = [
        _Stratum(size, [forked[t] - base[t] for t in ids if t in forked])
        for ids, size in ((plan.differing, len(plan.differing)), (plan.sampled, plan.others))
        if size
    ]
    forked_strata = [h for h in strata if h.diffs]
    used = sum(len(h.diffs) for h in forked_strata)
    # A stratum with no task forked (none sampled, or the fork scored none) adds nothing to the effect.
    effect = math.fsum(h.size * h.mean for h in forked_strata) / n if n else 0.0
    variances = [h.variance if h.diffs else None for h in strata]  # its spread: not known
    if used < 2 or any(v is None for v in variances):
        return effect, None, used
    known = [v or 0.0 for v in variances]
    spread = math.fsum((h.size - 1) * v + h.size * (h.mean - effect) ** 2 for h, v in zip(strata, known, strict=True))
    within = math.fsum(
        (h.size / n) ** 2 * v * (1 / len(h.diffs) - 1 / h.size) for h, v in zip(strata, known, strict=True)
    )
    return effect, math.sqrt(spread / (n - 1) / n + within), used


def _p_value(effect: float, stderr: float | None, used: int) -> float | None:
    """Two-sided: the normal test; when every difference is the same (no spread), the exact sign test over the
    tasks forked (each moved the same way: ``2 * 0.5^n``; none moved: 1)."""
    from scipy.stats import norm

    if stderr is None:
        return None
    if stderr == 0:
        return 1.0 if effect == 0 else min(1.0, 2 * 0.5**used)
    return float(2 * norm.sf(abs(effect) / stderr))


def effects(
    plan: Plan, changes: Sequence[Change], base: Mapping[str, float], forks: Sequence[Mapping[str, float]]
) -> list[Effect]:
    """Each change's effect from its fork's scores (task id -> score; a task the fork left unscored is skipped)."""
    from scipy.stats import norm

    level = 1 - ALPHA / (2 * max(1, len(changes)))
    z = float(norm.ppf(level))
    out = []
    for change, forked in zip(changes, forks, strict=True):
        value, se, used = _effect(plan, base, forked)
        ci = None if se is None else [value - z * se, value + z * se]
        p = _p_value(value, se, used)
        fixed = sum(1 for t in plan.tasks if t in forked and forked[t] > base[t])
        broken = sum(1 for t in plan.tasks if t in forked and forked[t] < base[t])
        out.append(Effect(change, value, se, ci, p, tasks=used, flipped={"fixed": fixed, "broken": broken}))
    for effect, q in zip(out, holm([e.p_value for e in out]), strict=True):
        effect.p_holm = q
    return out
