"""Shared corpus loading for the parsing tests (the corpora live in the repo, under tests/corpora)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

CORPORA = Path(__file__).resolve().parent.parent / "corpora"


@cache
def load_corpus(name: str) -> tuple[dict[str, Any], ...]:
    with (CORPORA / name).open(encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def tools_of(row: dict[str, Any]) -> dict[str, Any] | None:
    """The tool knowledge a row's peer test had: schemas when given, else just the names."""
    if row.get("schema"):
        return dict(row["schema"])
    if row.get("tools"):
        return {name: {} for name in row["tools"]}
    return None
