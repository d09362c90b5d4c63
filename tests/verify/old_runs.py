"""Six runs made with flowllm at f528059, before the run auditor, the package moves and the typed records; their
dataset is the bundled sample. plain: a clean run; fork: a fork with repair=strict; budget: a budget stop;
epochs: 3 epochs under a tight budget; replay: an exact replay of plain; refused: plain after a resume refused
with tools=none."""

from __future__ import annotations

import tarfile
from pathlib import Path

OLD_RUNS = Path(__file__).resolve().parent / "data" / "runs-f528059.tar.xz"


def unpack_old_runs(folder: Path, only: str | None = None) -> Path:
    """The runs unpacked into ``folder`` (only the run named ``only``, when given); returns ``folder``."""
    with tarfile.open(OLD_RUNS) as archive:
        members = [m for m in archive if only is None or m.name.split("/")[0] == only]
        archive.extractall(folder, filter="data", members=members)
    return folder
