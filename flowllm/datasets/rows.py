"""Rows of a local table file: JSON lines, JSON, CSV, TSV or Parquet, or every such file of a folder.

Each row comes with where it is (``file:line`` or ``file:row N``) so a loader can name the bad row. Parquet is
read with pyarrow when it is installed (``pip install 'flowllm[parquet]'``); it is not a runtime dependency.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowllm.datasets.task import DatasetError

SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")


@dataclass(frozen=True)
class Row:
    where: str  # file:line, for messages
    values: dict[str, Any]


def table_files(path: Path) -> list[Path]:
    """The file itself, or the table files of a folder (recursively, in name order; hidden ones skipped)."""
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise DatasetError(f"{path}: unsupported file type '{path.suffix}' (expected {', '.join(SUFFIXES)})")
        return [path]
    found = sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and p.suffix.lower() in SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    if not found:
        raise DatasetError(f"'{path}' holds no table file ({', '.join(SUFFIXES)})")
    return found


def columns_of(file: Path) -> list[str] | None:
    """The header of a CSV/TSV file or the schema of a Parquet file; None for JSON (rows may differ)."""
    suffix = file.suffix.lower()
    if suffix in (".csv", ".tsv"):
        with file.open(encoding="utf-8-sig", newline="") as fh:
            header = next(csv.reader(fh, delimiter="\t" if suffix == ".tsv" else ","), None)
        return header or []
    if suffix == ".parquet":
        return list(_parquet().ParquetFile(file).schema_arrow.names)
    return None


def read_rows(file: Path) -> Iterator[Row]:
    suffix = file.suffix.lower()
    try:
        if suffix == ".jsonl":
            yield from _jsonl(file)
        elif suffix == ".json":
            yield from _json(file)
        elif suffix in (".csv", ".tsv"):
            yield from _csv(file, "\t" if suffix == ".tsv" else ",")
        else:
            yield from _parquet_rows(file)
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _jsonl(file: Path) -> Iterator[Row]:
    with file.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{file}:{number}"
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(value, dict):
                raise DatasetError(f"{where}: expected a JSON object, got {type(value).__name__}")
            yield Row(where, value)


def _json(file: Path) -> Iterator[Row]:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{file}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if isinstance(value, dict):  # {"data": [...]} or {"test": [...]}: the one list inside
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DatasetError(f"{file}: expected a list of rows (or an object holding one list)")
        value = lists[0]
    if not isinstance(value, list):
        raise DatasetError(f"{file}: expected a list of rows, got {type(value).__name__}")
    for index, item in enumerate(value, start=1):
        if not isinstance(item, dict):
            raise DatasetError(f"{file}: row {index} is not an object")
        yield Row(f"{file}: row {index}", item)


def _csv(file: Path, delimiter: str) -> Iterator[Row]:
    # BrowseComp's and HLE's exports hold long cells; the default 128 KiB limit is too small for some.
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with file.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        for index, record in enumerate(reader, start=1):
            if None in record:
                raise DatasetError(f"{file}: row {index} has more cells than the header has columns")
            yield Row(f"{file}: row {index}", dict(record))


def _parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            "reading Parquet needs pyarrow: pip install 'flowllm[parquet]' (or convert the file to JSON lines)"
        ) from None
    return pq


def _parquet_rows(file: Path) -> Iterator[Row]:
    table = _parquet().read_table(file)
    for index, record in enumerate(table.to_pylist(), start=1):
        yield Row(f"{file}: row {index}", record)
