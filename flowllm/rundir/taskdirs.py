"""A task's folder name: its id when that can name a folder on any filesystem, else a safe name derived from it.

Dataset ids are free text: ``a/b`` would make a subfolder (or climb out with ``../``), a 300-character id
fails with ENAMETOOLONG, a NUL or a leading dot is trouble. Such ids get ``<readable part>-<hash>``: stable
across runs (so resume finds the folder again), distinct for distinct ids, at most 120 bytes. The id itself
is kept in ``result.json``.
"""

from __future__ import annotations

import functools
import hashlib
import re

MAX_NAME_BYTES = 120  # far below NAME_MAX (255) so suffixes like ".result.json.<pid>.<tid>.tmp" still fit
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@functools.lru_cache(maxsize=65536)
def task_folder_name(task_id: str) -> str:
    """The folder name under ``tasks/`` for ``task_id`` (cached: the recorder asks once per node)."""
    if _PLAIN.fullmatch(task_id) and len(task_id.encode()) <= MAX_NAME_BYTES:
        return task_id
    digest = hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    readable = _UNSAFE.sub("_", task_id).strip("._-")[: MAX_NAME_BYTES - 20] or "task"
    return f"{readable}-{digest}"
