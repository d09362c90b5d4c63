"""``digests.json``: a digest of every node's ``output.json`` of one run of a task, written when the run of the
task ends, so that a replay's audit compares what a node produced with one read per task instead of one per
node (flowllm/run/replay_audit.py).

    tasks/<task>/digests.json                  {"format_version": 1, "algorithm": "xxh3-128",
    tasks/<task>/epochs/<n>/digests.json        "outputs": {"turn_001/03_call_model": "<hex>", ...}}

A key is the node's folder under the records folder (a sub-agent's turns under their scope). The files stay
the record: a node missing from the digests is compared with its file, as in runs made before digests were
written; ``flowllm verify`` checks each digest against its file, so a record changed after the run is seen
(a checksum: it catches accidents and careless edits, not a record forged to collide).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import xxhash

from flowllm.rundir.layout import DIGESTS_FILE, turn_folder

__all__ = ["ALGORITHM", "Digests", "digest", "node_key", "read_digests"]

ALGORITHM = "xxh3-128"
FORMAT_VERSION = 1


def digest(data: bytes) -> str:
    """The digest of a record's bytes, as ``digests.json`` keeps it: XXH3's 128 bits, a checksum (about 0.1 us
    for a node's 2 KB, 15 times less than BLAKE2b), not a signature: it says whether a record is the one digested,
    as ``flowllm verify`` checks; what a bundle publishes is hashed with SHA-256 (its manifest)."""
    return xxhash.xxh3_128_hexdigest(data)


def node_key(turn: int, folder: str, scope: str = "") -> str:
    """A node's key in ``digests.json``: its folder under the records folder (``NN_name`` as ``folder``)."""
    own = f"{turn_folder(turn)}/{folder}"
    return f"{scope}/{own}" if scope else own


@dataclass
class Digests:
    """The digests of one records folder (a task's, or one epoch's)."""

    outputs: dict[str, str] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        body = {"format_version": FORMAT_VERSION, "algorithm": ALGORITHM, "outputs": self.outputs}
        return orjson.dumps(body, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> Digests | None:
        """None when the bytes are not digests this version can read (the files are then compared one by one)."""
        try:
            body: Any = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(body, dict) or body.get("algorithm") != ALGORITHM:
            return None
        outputs = body.get("outputs")
        if not isinstance(outputs, dict):
            return None
        return cls({str(k): v for k, v in outputs.items() if isinstance(v, str)})


def read_digests(records: Path | str) -> Digests | None:
    """The digests of a records folder; None when it has none (an older run, a task whose run did not end)."""
    try:
        data = (Path(records) / DIGESTS_FILE).read_bytes()
    except OSError:
        return None
    return Digests.from_bytes(data)
