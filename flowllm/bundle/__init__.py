"""Reproduction bundles: ``flowllm bundle RUN -o FILE`` writes a run into one archive anyone can check offline,
``flowllm verify FILE`` checks it (replays every task from its saved replies, scores it again, recomputes the
statistics and runs the run auditor).

    manifest.py   the manifest: every file's SHA-256, each task's ground-truth hash, the dataset's file hashes
    archive.py    the compressed tar (zstd, or gzip without the zstandard package), written and unpacked safely
    answers.py    the normalised answer's hash, and ground truth taken out of a record
    collect.py    what of a run folder goes in: no log, no workspace, no ground truth, no secret
    make.py       a run or a sweep into one bundle
    unpack.py     a bundle unpacked into a fresh folder and checked against its manifest
    replay.py     one bundled run replayed offline and compared task by task
    check.py      the whole check of a bundle, run by run
    cli.py        ``flowllm bundle`` and ``flowllm verify FILE``
"""

from __future__ import annotations

from flowllm.bundle.check import check_bundle
from flowllm.bundle.make import make_bundle

__all__ = ["check_bundle", "make_bundle"]
