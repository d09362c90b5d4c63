"""``experiment.shard=I/N``: one deterministic slice of the selected tasks, for runs spread over machines.

A task belongs to shard ``I`` of ``N`` when the SHA-256 of its id, read as a number, is ``I`` modulo ``N``
(``I`` counts from 0, as Kubernetes' ``JOB_COMPLETION_INDEX`` and a SLURM array ``--array=0-3`` do). The slice
depends on the task's id only: not on the dataset's order, the machine, the Python version or which other tasks
were selected, so N processes started anywhere with the same dataset and ``I`` = 0..N-1 run every task exactly
once. ``flowllm merge`` (flowllm/experiment/merge.py) puts their folders together again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from flowllm.datasets.task import Task
from flowllm.errors import ConfigError

__all__ = ["SHARD_SETTING", "ShardSpec", "shard_of", "shard_override"]

MAX_SHARDS = 100_000
SHARD_SETTING = "experiment.shard"


def shard_override(override: object) -> str | None:
    """The ``I/N`` a command-line override sets ``experiment.shard`` to (``experiment.shard=0/4``, with a ``+``
    or ``~`` prefix too); None for any other override."""
    key, _, value = str(override).lstrip("+~").partition("=")
    return value if key == SHARD_SETTING else None


def shard_of(task_id: str, count: int) -> int:
    """The shard (0..count-1) a task id belongs to: stable across machines, processes and datasets."""
    digest = hashlib.sha256(task_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``index`` (0-based) of ``count``."""

    index: int
    count: int

    @classmethod
    def parse(cls, value: object) -> ShardSpec | None:
        """``experiment.shard`` as a spec: None when unset; ``ConfigError`` (one line) when it is not ``I/N`` with
        0 <= I < N."""
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        text = str(value).strip()
        index_text, slash, count_text = text.partition("/")
        if not slash or not index_text.strip().isdigit() or not count_text.strip().isdigit():
            raise ConfigError(f"experiment.shard must be I/N (shard I of N, I counted from 0, e.g. 0/4), not {text!r}")
        index, count = int(index_text), int(count_text)
        if not 1 <= count <= MAX_SHARDS:
            raise ConfigError(f"experiment.shard {text}: N must be from 1 to {MAX_SHARDS}")
        if index >= count:
            raise ConfigError(f"experiment.shard {text} is out of range: I counts from 0, so it must be 0..{count - 1}")
        return cls(index, count)

    def select(self, tasks: list[Task]) -> list[Task]:
        """This shard's tasks, in the order given."""
        return [t for t in tasks if shard_of(t.task_id, self.count) == self.index]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
