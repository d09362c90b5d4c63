"""Each ``digests.json`` against the records it digests: a replay's audit trusts a digest instead of reading the
file, so an output changed after the run (or a digest changed without it) must not go unseen.

* every digest names a node folder inside its records folder whose ``output.json`` is there, and equals the
  digest of that file's bytes;
* a records folder without ``digests.json`` (older runs, a task whose run did not end) has nothing to check.

A digest is a checksum (XXH3): it catches a record changed by mistake or by a careless edit, not one forged to
collide with it.
"""

from __future__ import annotations

from pathlib import Path

from flowllm.rundir.digests import Digests, digest
from flowllm.rundir.layout import DIGESTS_FILE, OUTPUT_FILE
from flowllm.verify.evidence import RunEvidence
from flowllm.verify.findings import Audit

__all__ = ["check_digests"]


def _records(ev: RunEvidence) -> list[Path]:
    """Every records folder of the run: each task's, and each epoch's of an epochs run."""
    folders = [ev.layout.records(task_id) for task_id in ev.results]
    folders += [ev.layout.records(task_id, n) for task_id, epochs in ev.epoch_results.items() for n in epochs]
    return folders


def _check_one(ev: RunEvidence, audit: Audit, records: Path) -> None:
    path = records / DIGESTS_FILE
    try:
        data = path.read_bytes()
    except OSError:
        return
    name = ev.rel(path)
    found = Digests.from_bytes(data)
    if found is None:
        audit.flag(name, "digests", "unreadable", "digests a replay can read", "flowllm/rundir/digests.py")
        return
    for key, saved in sorted(found.outputs.items()):
        if Path(key).is_absolute() or ".." in Path(key).parts:  # never read outside the run
            audit.flag(name, f"outputs.{key}", saved, "a node folder inside the records folder", name)
            continue
        output = records / key / OUTPUT_FILE
        try:
            recomputed = digest(output.read_bytes())
        except OSError:
            recomputed = "no such file"
        audit.check(name, f"outputs.{key}", saved, recomputed, ev.rel(output))


def check_digests(ev: RunEvidence, audit: Audit) -> None:
    """Every digest of the run against the file it digests."""
    for records in _records(ev):
        _check_one(ev, audit, records)
