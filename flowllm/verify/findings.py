"""What the auditor reports: one ``Finding`` per value the run states that its evidence does not give."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TOLERANCE", "Audit", "Finding", "same"]

# Figures are saved rounded to 6 places (costs, intervals); two values within this are the same figure.
TOLERANCE = 2e-6


def same(saved: Any, recomputed: Any) -> bool:
    """Whether a saved value is the recomputed one: numbers within ``TOLERANCE``, containers leaf by leaf."""
    if isinstance(saved, bool) or isinstance(recomputed, bool):
        return saved is recomputed or (saved == recomputed and type(saved) is type(recomputed))
    if isinstance(saved, int | float) and isinstance(recomputed, int | float):
        if math.isnan(saved) or math.isnan(recomputed):
            return math.isnan(saved) and math.isnan(recomputed)
        return abs(float(saved) - float(recomputed)) <= TOLERANCE
    if isinstance(saved, dict) and isinstance(recomputed, dict):
        return saved.keys() == recomputed.keys() and all(same(saved[k], recomputed[k]) for k in saved)
    if isinstance(saved, list | tuple) and isinstance(recomputed, list | tuple):
        return len(saved) == len(recomputed) and all(same(a, b) for a, b in zip(saved, recomputed, strict=True))
    return bool(saved == recomputed)


@dataclass(frozen=True)
class Finding:
    """A value the run states (``saved``) that its evidence does not give (``recomputed``)."""

    file: str  # relative to the run folder
    field: str  # a dotted path inside the file (``stats.accuracy.ci95``)
    saved: Any
    recomputed: Any
    evidence: str = ""  # what the recomputed value comes from, when it is not obvious

    def line(self) -> str:
        why = f" ({self.evidence})" if self.evidence else ""
        said, found = _shown(self.saved), _shown(self.recomputed)
        return f"{self.file}: {self.field}: the run says {said}, the evidence gives {found}{why}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "field": self.field,
            "saved": self.saved,
            "recomputed": self.recomputed,
            "evidence": self.evidence,
        }


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass
class Audit:
    """One run's audit: what disagreed, how many values were compared, and what could not be checked."""

    run_dir: Path
    findings: list[Finding] = field(default_factory=list)
    compared: int = 0
    not_checked: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return not self.findings

    def check(self, file: str, name: str, saved: Any, recomputed: Any, evidence: str = "") -> bool:
        """Compare one value; a disagreement becomes a finding. Returns whether they agree."""
        self.compared += 1
        if same(saved, recomputed):
            return True
        self.findings.append(Finding(file, name, saved, recomputed, evidence))
        return False

    def flag(self, file: str, name: str, saved: Any, bound: str, evidence: str = "") -> None:
        """A value outside what the evidence allows (``bound``: "at most 0.0244"), where no single value is owed."""
        self.compared += 1
        self.findings.append(Finding(file, name, saved, bound, evidence))

    def skip(self, why: str) -> None:
        if why not in self.not_checked:
            self.not_checked.append(why)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "verified": self.verified,
            "compared": self.compared,
            "findings": [f.to_dict() for f in self.findings],
            "not_checked": list(self.not_checked),
        }
