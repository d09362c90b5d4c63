"""The audit of a run folder, or of each job of a sweep folder: the checks in the order their findings read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flowllm.rundir.layout import SUMMARY_FILE, SWEEP_SUMMARY_FILE
from flowllm.verify.evidence import VerifyInputError, load_evidence
from flowllm.verify.exports import check_export
from flowllm.verify.findings import Audit
from flowllm.verify.settings import check_settings
from flowllm.verify.spend import check_spend
from flowllm.verify.tasks import check_tasks
from flowllm.verify.totals import check_totals

__all__ = ["audit_path", "audit_run", "sweep_jobs"]

MULTIRUN_FILE = "multirun.yaml"  # what Hydra writes at the top of a multirun's folder


def audit_run(run_dir: Path, *, dataset: Path | None = None, exports: Sequence[Path] = ()) -> Audit:
    """Every derived number of ``run_dir`` recomputed from its evidence, and each export given compared with it;
    raises ``VerifyInputError`` for bad input."""
    ev = load_evidence(run_dir, dataset=dataset)
    audit = Audit(run_dir)
    check_settings(ev, audit)
    outcomes = check_tasks(ev, audit)
    check_totals(ev, outcomes, audit)
    check_spend(ev, audit)
    for export in exports:
        check_export(export, outcomes, audit)
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
