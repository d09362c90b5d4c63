"""What ``inspect bisect`` reads for each of A and B: a run folder as it is (a sweep's job is one:
``SWEEP/0 SWEEP/3``), a bundle of one run unpacked into a scratch folder (it carries the config, overrides,
fingerprint and every saved reply, which is all a fork replays), and a sweep, given whole, refused with what to
pass instead: a bisect compares two runs, and which two jobs of a sweep is the user's choice.
"""

from __future__ import annotations

from pathlib import Path

from flowllm.analysis.epoch_runs import NoRun
from flowllm.analysis.frames import find_runs
from flowllm.bundle.unpack import unpacked_runs

__all__ = ["bisect_input"]


def bisect_input(given: Path, scratch: Path) -> Path:
    """The run folder to read for ``given`` (a bundle is unpacked into ``scratch``, a fresh folder); raises
    ``NoRun`` for a path with no run and for a sweep of several, naming two of its jobs to pass."""
    bundle = given.is_file()
    folder = unpacked_runs(given, scratch) if bundle else given
    runs = find_runs(folder)
    if not runs:
        raise NoRun(f"{given} is not a run folder nor a bundle of one (no summary.json or tasks/ found)")
    if len(runs) == 1:
        return runs[0]
    jobs = [run.relative_to(folder).as_posix() for run in runs]
    shown = ", ".join(jobs[:6]) + (", ..." if len(jobs) > 6 else "")
    what = (
        f"bundle each job on its own (flowllm bundle SWEEP/{jobs[0]} -o A.bundle) and pass two"
        if bundle
        else f"pass two of its jobs, e.g. {given / jobs[0]} {given / jobs[-1]}"
    )
    raise NoRun(f"{given} is a sweep of {len(runs)} runs ({shown}): bisect compares two runs; {what}")
