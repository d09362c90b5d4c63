"""The audit of a run folder, or of each job of a sweep folder: the checks in the order their findings read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flowllm.errors import FlowError
from flowllm.rundir.layout import SUMMARY_FILE, SWEEP_SUMMARY_FILE
from flowllm.verify.digests import check_digests
from flowllm.verify.evidence import VerifyInputError, load_evidence
from flowllm.verify.exports import check_export
from flowllm.verify.findings import Audit
from flowllm.verify.recorded import check_acted, check_contamination
from flowllm.verify.resumed import check_resumed
from flowllm.verify.settings import check_settings
from flowllm.verify.spend import check_spend
from flowllm.verify.tasks import check_tasks
from flowllm.verify.totals import check_totals
from flowllm.verify.verdicts import check_fork, check_limits

__all__ = ["Verification", "audit_path", "audit_run", "sweep_jobs", "verification"]

MULTIRUN_FILE = "multirun.yaml"  # what Hydra writes at the top of a multirun's folder


def audit_run(run_dir: Path, *, dataset: Path | None = None, exports: Sequence[Path] = ()) -> Audit:
    """Every derived number of ``run_dir`` recomputed from its evidence, and each export given compared with it;
    raises ``VerifyInputError`` for bad input."""
    ev = load_evidence(run_dir, dataset=dataset)
    audit = Audit(run_dir)
    check_settings(ev, audit)
    outcomes = check_tasks(ev, audit)
    check_totals(ev, outcomes, audit)
    check_contamination(ev, audit)
    check_spend(ev, audit)
    check_limits(ev, audit)
    check_fork(ev, outcomes, audit)
    check_resumed(ev, audit)
    check_acted(ev, audit)
    check_digests(ev, audit)
    for export in exports:
        check_export(export, outcomes, ev, audit)
    return audit


def sweep_jobs(folder: Path) -> list[Path]:
    """The job folders of a sweep folder (Hydra's ``multirun.yaml`` or flowllm's sweep summary beside them), in
    name order; empty for anything else."""
    if not any((folder / name).is_file() for name in (SWEEP_SUMMARY_FILE, MULTIRUN_FILE)):
        return []
    jobs = sorted(p for p in folder.iterdir() if p.is_dir() and (p / SUMMARY_FILE).is_file())
    if not jobs:
        raise VerifyInputError(f"{folder} is a sweep folder whose jobs wrote no summary.json")
    return jobs


def audit_path(path: Path, *, dataset: Path | None = None, exports: Sequence[Path] = ()) -> list[Audit]:
    """The audit of a run folder, or one per job of a sweep folder (exports are a single run's)."""
    if not path.is_dir():
        raise VerifyInputError(f"{path} is not a folder (a run folder or a sweep folder)")
    jobs = sweep_jobs(path)
    if jobs and exports:
        raise VerifyInputError("--export compares one run's export: give the job's folder, not the sweep's")
    if jobs:
        return [audit_run(job, dataset=dataset) for job in jobs]
    return [audit_run(path, dataset=dataset, exports=exports)]


@dataclass(frozen=True)
class Verification:
    """Whether a run verifies, in a line a report can show: ``verified`` None when it could not be audited."""

    verified: bool | None
    compared: int = 0
    disagreements: int = 0
    first: str | None = None  # the first disagreement, or why the run could not be audited

    @property
    def text(self) -> str:
        if self.verified is None:
            return f"not known: {self.first}"
        if self.verified:
            return f"yes: {self.compared} values agree with the evidence (flowllm verify)"
        return f"NO: {self.disagreements} disagreement(s), the first: {self.first} (flowllm verify lists them)"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text}


def verification(run_dir: Path) -> Verification:
    """The audit of one run folder, summed up for ``flowllm inspect RUN`` and the HTML report; never raises for
    a run that cannot be audited (it says why)."""
    try:
        audit = audit_run(run_dir)
    except FlowError as exc:
        return Verification(None, first=str(exc))
    first = audit.findings[0].line() if audit.findings else None
    return Verification(audit.verified, audit.compared, len(audit.findings), first)
