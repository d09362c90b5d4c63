"""``inspect bisect A B``'s plan and arithmetic: which settings differ between two runs (their fingerprints), the
override that changes each in a fork of A, the tasks to fork, the projected cost, and each setting's effect.

A setting is a config group whose choice differs (``repair=none``: every key under ``repair.``) or one key
(``agent.max_turns=1``); a key whose saved value interpolates another (``${agent.max_turns}``) follows it. The
dataset (its settings and its files' hashes) cannot be changed by a fork: named, left out.

Each fork runs on the tasks whose score differs between A and B (stratum D, all of them) and a seeded sample S
of the others (stratum O, to catch changes that cancel). A setting's effect is the stratified mean of its paired
differences (fork - A): ``(|D| mean_D + |O| mean_S) / N`` over the N common tasks, with the stratified standard
error ``sqrt(sum_h W_h^2 s_h^2 / n_h)``; the intervals are at the Bonferroni level ``1 - alpha / m`` for m
settings and the p values (normal test) Holm-adjusted. The interaction is the observed difference minus the sum
of the effects, so the effects and the interaction add up to the observed difference by construction.
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
    return [Change(name, overrides[name], tuple(ks)) for name, ks in changes.items()], sorted(set(left_out))


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


def _stratum(diffs: Sequence[float]) -> tuple[float, float | None]:
    """(mean, variance of the mean) of one stratum's differences; the variance is None below two tasks."""
    mean = math.fsum(diffs) / len(diffs)
    if len(diffs) < 2:
        return mean, None
    var = math.fsum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
    return mean, var / len(diffs)


def _effect(plan: Plan, base: Mapping[str, float], forked: Mapping[str, float]) -> tuple[float, float | None, int]:
    n = len(plan.common)
    total, variance, used = 0.0, 0.0, 0
    for ids, size in ((plan.differing, len(plan.differing)), (plan.sampled, plan.others)):
        diffs = [forked[t] - base[t] for t in ids if t in forked]
        if not diffs or not size:
            continue
        mean, var = _stratum(diffs)
        total += size / n * mean
        used += len(diffs)
        variance += (size / n) ** 2 * (var or 0.0)
    return total, math.sqrt(variance) if used >= 2 else None, used


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
        if se is None:
            p = None
        elif se == 0:
            p = 1.0 if value == 0 else 0.0
        else:
            p = float(2 * norm.sf(abs(value) / se))
        fixed = sum(1 for t in plan.tasks if t in forked and forked[t] > base[t])
        broken = sum(1 for t in plan.tasks if t in forked and forked[t] < base[t])
        out.append(Effect(change, value, se, ci, p, tasks=used, flipped={"fixed": fixed, "broken": broken}))
    for effect, q in zip(out, holm([e.p_value for e in out]), strict=True):
        effect.p_holm = q
    return out
