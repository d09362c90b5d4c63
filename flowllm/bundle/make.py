"""``flowllm bundle RUN -o FILE``: a run folder (or each job of a sweep folder) into one archive with its
manifest (flowllm/bundle/collect.py says what goes in)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from flowllm import __version__
from flowllm.bundle.archive import compression_available, write_bundle
from flowllm.bundle.collect import RunFiles, collect_run
from flowllm.bundle.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    MANIFEST_HASH_FILE,
    BundleInputError,
    Manifest,
    sha256,
)
from flowllm.verify.audit import sweep_jobs
from flowllm.verify.evidence import VerifyInputError

__all__ = ["RUNS_DIR", "SINGLE_RUN", "make_bundle"]

RUNS_DIR = "runs"  # each run's files are under runs/<name>/ in the archive
SINGLE_RUN = "run"  # the name of a lone run's folder


def _jobs(source: Path) -> list[tuple[str, Path]]:
    if not source.is_dir():
        raise BundleInputError(f"{source} is not a folder (a run folder or a sweep folder)")
    try:
        jobs = sweep_jobs(source)
    except VerifyInputError as exc:
        raise BundleInputError(str(exc)) from None
    return [(job.name, job) for job in jobs] if jobs else [(SINGLE_RUN, source)]


def _entries(runs: list[RunFiles], manifest: Manifest) -> Iterator[tuple[str, bytes]]:
    for run in runs:
        for rel, data in run.files.items():
            yield f"{RUNS_DIR}/{run.job.name}/{rel}", data
    body = manifest.to_bytes()
    yield MANIFEST_FILE, body
    yield MANIFEST_HASH_FILE, (sha256(body) + "\n").encode()


def make_bundle(source: Path, out: Path, *, with_answers: bool = False) -> Manifest:
    """Write the bundle of ``source`` to ``out``; raises ``BundleInputError`` for what is not a run."""
    jobs = _jobs(source)
    if out.resolve().is_relative_to(source.resolve()):
        raise BundleInputError(f"{out} is inside the run folder: write the bundle somewhere else")
    if not out.parent.is_dir():
        raise BundleInputError(f"{out.parent} is not a folder: the bundle cannot be written there")
    runs = [collect_run(path, name, with_answers=with_answers) for name, path in jobs]
    files = {f"{RUNS_DIR}/{r.job.name}/{rel}": sha256(data) for r in runs for rel, data in r.files.items()}
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        flowllm_version=__version__,
        compression=compression_available(),
        with_answers=with_answers,
        sweep=len(jobs) > 1 or jobs[0][0] != SINGLE_RUN,
        jobs=[r.job for r in runs],
        files=files,
    )
    write_bundle(out, _entries(runs, manifest), manifest.compression)
    return manifest
