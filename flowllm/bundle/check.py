"""``flowllm verify FILE``: a bundle checked against its manifest, each run in it replayed offline, every answer
re-extracted and re-scored, every statistic recomputed and the run auditor run on it.

The order: the manifest (a file that differs is named, nothing is replayed); the dataset (given with
``--dataset`` or the one the run names, if it is here: files that differ from the bundle's are bad input, exit 2,
unless ``--dataset-changed-ok``); the answers put back where the dataset's answer has the hash the bundle records
(a dataset without answers: each answer is scored by its hash); the replay; the audit.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from omegaconf import OmegaConf

from flowllm.bundle.answers import answer_hash
from flowllm.bundle.make import RUNS_DIR
from flowllm.bundle.manifest import BundleInputError, JobEntry
from flowllm.bundle.replay import Replayed, compare_tasks, replay_run, replay_summary
from flowllm.bundle.unpack import unpack
from flowllm.core.scratch import new_scratch
from flowllm.datasets.adapters import DatasetSpec, load_dataset
from flowllm.datasets.task import Task
from flowllm.errors import FlowError
from flowllm.resources import bundled
from flowllm.run.report import format_usd
from flowllm.rundir.layout import CONFIG_FILE, FINGERPRINT_FILE, RESULT_FILE, SUMMARY_FILE, TASKS_DIR
from flowllm.rundir.results import RunSummary
from flowllm.setup.fingerprint import dataset_files
from flowllm.verify.audit import audit_run
from flowllm.verify.findings import same
from flowllm.verify.settings import DIGEST_FIELDS

__all__ = ["JobCheck", "check_bundle"]


# The auditor's comparisons of the fingerprint's digest (flowllm/verify/settings.py).
@dataclass
class JobCheck:
    """What the check of one bundled run found: the line it reproduced, or its problems (the first one first)."""

    name: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    line: str = ""
    dataset_changed: bool = False  # --dataset-changed-ok let a dataset with other files through

    @property
    def reproduced(self) -> bool:
        return not self.problems


def _dataset(job: JobEntry, given: Path | None, changed_ok: bool, check: JobCheck) -> Path:
    path = given if given is not None else bundled(job.dataset)
    if not path.exists():
        raise BundleInputError(f"the run's dataset {job.dataset} is not here: give it with --dataset PATH")
    if not job.dataset_files:  # a run made before fingerprints: nothing to compare with
        check.notes.append(f"the bundle records no file hashes of the dataset: {path} is used unchecked")
        return path
    now = dataset_files(path)
    changed = sorted(n for n in {*now, *job.dataset_files} if now.get(n) != job.dataset_files.get(n))
    if changed:
        what = f"the dataset {path} differs from the one the run read ({len(changed)} file(s), first {changed[0]})"
        if not changed_ok:
            raise BundleInputError(f"{what}: give the same dataset, or --dataset-changed-ok to verify anyway")
        check.notes.append(what)
        check.dataset_changed = True
    return path


def _tasks(run_dir: Path, path: Path) -> list[Task]:
    cfg = OmegaConf.load(run_dir / CONFIG_FILE)
    try:
        return load_dataset(DatasetSpec.from_config(cfg.dataset, path))
    except FlowError as exc:
        raise BundleInputError(f"the dataset {path} cannot be read ({exc})".splitlines()[0]) from None


def _restore_answers(run_dir: Path, job: JobEntry, tasks: list[Task], check: JobCheck) -> dict[str, str | None]:
    """Put the dataset's answers back into the results where their hashes are the bundle's; returns the hashes
    of the tasks the dataset has no answer for (scored by hash)."""
    answers = {t.task_id: t.ground_truth for t in tasks}
    by_hash: dict[str, str | None] = {
        tid: h for tid, h in job.ground_truth.items() if answers.get(tid) is None and h is not None
    }
    for path in sorted((run_dir / TASKS_DIR).rglob(RESULT_FILE)):
        try:
            data = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError:
            raise BundleInputError(f"{path.relative_to(run_dir.parent.parent)} is not valid JSON") from None
        if not isinstance(data, dict) or data.get("ground_truth") is not None:
            continue
        task_id, truth = str(data.get("task_id")), answers.get(str(data.get("task_id")))
        if truth is None:
            continue
        if answer_hash(truth) != job.ground_truth.get(task_id):
            check.notes.append(f"task {task_id}: the dataset's answer is not the one the bundle's hash records")
            continue
        data["ground_truth"] = truth
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    return by_hash


def _headline(summary: RunSummary, exact: int, tasks: int) -> str:
    acc = summary.stats.accuracy if summary.stats is not None else {}
    # A sample's cents shown as such: "$0.01" for $0.0063 would be another figure than the run's.
    cost = f"cost {format_usd(summary.cost_usd)}" if summary.cost_usd is not None else "cost not known"
    if not acc or acc.get("mean") is None:
        return f"reproduced: no accuracy (nothing scored), {exact}/{tasks} tasks replayed exactly, {cost}"
    low, high = acc.get("ci95") or (float("nan"), float("nan"))
    return (
        f"reproduced: {100 * acc['mean']:.1f}% ± {100 * (acc.get('stderr') or 0):.1f} "
        f"[{100 * low:.1f}, {100 * high:.1f}] n={acc.get('n')}, {exact}/{tasks} tasks replayed exactly, {cost}"
    )


def _check_stats(saved: RunSummary, again: RunSummary, check: JobCheck, prefix: str) -> None:
    saved_acc = saved.stats.accuracy if saved.stats else {}
    again_acc = again.stats.accuracy if again.stats else {}
    for key in ("mean", "stderr", "ci95", "n"):
        if not same(saved_acc.get(key), again_acc.get(key)):
            check.problems.append(
                f"{prefix}/{SUMMARY_FILE}: stats.accuracy.{key} is {saved_acc.get(key)!r}, "
                f"the replay gives {again_acc.get(key)!r}"
            )


def _check_by_hash(saved: RunSummary, replayed: Replayed, hashed: int, check: JobCheck, prefix: str) -> None:
    """A dataset without the answers: the right answers counted by hash against the summary's count."""
    if hashed == replayed.tasks and saved.correct != replayed.hash_correct:
        check.problems.append(
            f"{prefix}/{SUMMARY_FILE}: correct is {saved.correct}, the answers' hashes give {replayed.hash_correct}"
        )
    check.notes.append(
        f"{hashed} task(s) scored by the bundle's answer hashes (the dataset has no answer for them); the run "
        "auditor, which reads the answers, was not run"
    )


def _audit(run_dir: Path, job: JobEntry, path: Path, check: JobCheck, prefix: str) -> None:
    """The run auditor on the unpacked run, less what the bundle itself changed (masked secrets, a dataset let
    through with --dataset-changed-ok)."""
    findings = audit_run(run_dir, dataset=path).findings
    if FINGERPRINT_FILE in job.masked:  # a secret the fingerprint held is masked: its digest cannot be recomputed
        findings = [f for f in findings if f.field not in DIGEST_FIELDS]
        check.notes.append(f"{FINGERPRINT_FILE}: its digest is not checked (a secret value in it is masked)")
    if check.dataset_changed:  # said before replaying, and let through
        findings = [f for f in findings if (f.file, f.field) != (FINGERPRINT_FILE, "dataset_files")]
    check.problems += [f"{prefix}/{finding.line()}" for finding in findings]


def _check_job(root: Path, job: JobEntry, path: Path, check: JobCheck, work: Path) -> JobCheck:
    run_dir = root / RUNS_DIR / job.name
    by_hash = _restore_answers(run_dir, job, _tasks(run_dir, path), check)
    prefix = f"{RUNS_DIR}/{job.name}"
    replayed = replay_run(run_dir, path, work / job.name)
    if replayed.error:
        check.problems.append(replayed.error)
        return check
    compare_tasks(run_dir, replayed, by_hash, root)
    check.problems += replayed.problems
    saved = RunSummary.from_dict(orjson.loads((run_dir / SUMMARY_FILE).read_bytes()))
    if by_hash:
        _check_by_hash(saved, replayed, len(by_hash), check, prefix)
    elif replayed.unscored_by_verdict:  # the replay scores them: the run's statistics are the auditor's to check
        check.notes.append(
            f"{replayed.unscored_by_verdict} task(s) a replay verdict left unscored (they parted from the run the "
            "bundled replay replayed): its statistics are recomputed by the run auditor, not by the replay"
        )
        _audit(run_dir, job, path, check, prefix)
    else:
        _check_stats(saved, replay_summary(replayed), check, prefix)
        _audit(run_dir, job, path, check, prefix)
    check.line = _headline(saved, replayed.exact, replayed.tasks)
    return check


def check_bundle(
    bundle: Path, *, dataset: Path | None = None, dataset_changed_ok: bool = False
) -> tuple[list[str], list[JobCheck]]:
    """The manifest's problems (files named; nothing replayed when there are any) and each run's check. Raises
    ``BundleInputError`` for bad input. Everything is unpacked and replayed in a temporary folder, removed after."""
    work = new_scratch("flowllm-verify-")
    try:
        unpacked = unpack(bundle, work / "bundle")
        if unpacked.tampered:
            return unpacked.tampered, []
        (work / "replay").mkdir()
        checks = [JobCheck(job.name) for job in unpacked.manifest.jobs]
        paths = [  # every dataset is checked before anything is replayed
            _dataset(job, dataset, dataset_changed_ok, check)
            for job, check in zip(unpacked.manifest.jobs, checks, strict=True)
        ]
        for job, path, check in zip(unpacked.manifest.jobs, paths, checks, strict=True):
            _check_job(unpacked.root, job, path, check, work / "replay")
        return [], checks
    finally:
        shutil.rmtree(work, ignore_errors=True)
