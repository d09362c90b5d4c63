"""The persistent memory store: SQLite, one row per memory, vectors as float32 blobs.

One file holds many namespaces (``memory.namespace``: one per agent, user or project) and vectors of several
embedders side by side (a memory is only compared with vectors of the embedder that made the query). The same
text is stored once per namespace and embedder. Search is exact: cosine similarity against every vector of the
namespace, which is fast enough for the tens of thousands of memories an agent accumulates (numpy, one matrix
product).

Each operation opens its own connection (SQLite connections are cheap), so concurrent tasks, and several
processes of a sweep, can share one file; WAL mode lets readers and the writer overlap.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id INTEGER PRIMARY KEY,
    namespace TEXT NOT NULL,
    embedder TEXT NOT NULL,
    text TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    vector BLOB NOT NULL,
    kind TEXT NOT NULL DEFAULT 'fact',
    source TEXT,
    created_at REAL NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    UNIQUE (namespace, embedder, text_hash)
);
CREATE INDEX IF NOT EXISTS memories_space ON memories (namespace, embedder);
"""


@dataclass
class Memory:
    id: int
    text: str
    kind: str
    source: str | None
    created_at: float
    score: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "kind": self.kind,
            "source": self.source,
            "score": round(self.score, 4),
        }


def _hash(text: str) -> str:
    return hashlib.sha256(text.strip().encode()).hexdigest()


class MemoryStore:
    """A SQLite file of memories (see the module doc)."""

    # One writer lock per file for this process (SQLite serialises processes itself).
    _locks: ClassVar[dict[str, threading.Lock]] = {}
    _locks_guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locks_guard:
            self._lock = self._locks.setdefault(str(self.path.resolve()), threading.Lock())
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30.0)
        try:
            with db:  # commit on success, roll back on error
                yield db
        finally:
            db.close()

    def add(
        self,
        namespace: str,
        embedder: str,
        texts: list[str],
        vectors: list[list[float]],
        *,
        kind: str = "fact",
        source: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> list[int]:
        """Store memories; returns the ids of the new ones (a text already stored is skipped)."""
        if len(texts) != len(vectors):
            raise ValueError("one vector per text")
        now = time.time()
        new: list[int] = []
        with self._lock, self._connect() as db:
            for text, vector in zip(texts, vectors, strict=True):
                if not text.strip():
                    continue
                cur = db.execute(
                    "INSERT OR IGNORE INTO memories (namespace, embedder, text, text_hash, vector, kind, source, "
                    "created_at, meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        namespace,
                        embedder,
                        text.strip(),
                        _hash(text),
                        np.asarray(vector, dtype=np.float32).tobytes(),
                        kind,
                        source,
                        now,
                        json.dumps(meta or {}, sort_keys=True),
                    ),
                )
                if cur.rowcount and cur.lastrowid is not None:
                    new.append(int(cur.lastrowid))
        return new

    def search(
        self,
        namespace: str,
        embedder: str,
        vector: list[float],
        *,
        top_k: int = 5,
        min_score: float = 0.0,
        created_before: float | None = None,
    ) -> list[Memory]:
        """The ``top_k`` memories most similar to ``vector`` with a cosine of at least ``min_score``, best first
        (ties: the older memory first, so results are stable)."""
        query = (
            "SELECT id, text, kind, source, created_at, meta, vector FROM memories WHERE namespace = ? AND embedder = ?"
        )
        params: list[Any] = [namespace, embedder]
        if created_before is not None:
            query += " AND created_at < ?"
            params.append(created_before)
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY id", params).fetchall()
        if not rows or top_k <= 0:
            return []
        q = np.asarray(vector, dtype=np.float32)
        matrix = np.stack([np.frombuffer(r[6], dtype=np.float32) for r in rows])
        if matrix.shape[1] != q.shape[0]:
            raise ValueError(f"memory vectors have {matrix.shape[1]} dimensions, the query has {q.shape[0]}")
        norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(q) or 1.0)
        scores = (matrix @ q) / np.where(norms == 0, 1.0, norms)
        order = sorted(range(len(rows)), key=lambda i: (-float(scores[i]), rows[i][0]))
        found = []
        for i in order[:top_k]:
            if float(scores[i]) < min_score:
                break
            r = rows[i]
            found.append(Memory(int(r[0]), r[1], r[2], r[3], float(r[4]), float(scores[i]), json.loads(r[5])))
        return found

    def count(self, namespace: str | None = None) -> int:
        with self._connect() as db:
            if namespace is None:
                return int(db.execute("SELECT COUNT(*) FROM memories").fetchone()[0])
            return int(db.execute("SELECT COUNT(*) FROM memories WHERE namespace = ?", (namespace,)).fetchone()[0])

    def all(self, namespace: str) -> list[Memory]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT id, text, kind, source, created_at, meta FROM memories WHERE namespace = ? ORDER BY id",
                (namespace,),
            ).fetchall()
        return [Memory(int(r[0]), r[1], r[2], r[3], float(r[4]), meta=json.loads(r[5])) for r in rows]
