"""The dataset adapter contract: a local file or folder in, the experiment's tasks out.

    tasks = load_dataset(spec)            # spec: DatasetSpec.from_config(cfg.dataset, path)

An adapter turns rows into ``Task``s (id, question, ground truth, attachment, level, metadata). Two ship:

* ``gaia``: GAIA's ``metadata.jsonl`` or a ``standardized_data.jsonl`` folder (``flowllm/datasets/gaia.py``);
* ``table``: any JSON lines, JSON, CSV, TSV or Parquet file (or a folder of them) with a field mapping, so a
  benchmark in a common shape is one YAML file (``conf/experiment/<name>.yaml``): which column is the question,
  which the answer, which the id, which become metadata (and the summary's breakdowns), whether some columns
  are encrypted with the row's canary (BrowseComp, xbench-DeepSearch), and which rows to leave out (HLE's
  image questions).

Mapped columns may be dotted paths into a nested value (``info.domain``); a cell holding a JSON object or a
Python dict literal as text (SimpleQA's ``metadata`` column) is read as that object.

Data is never fetched: when the file is missing, the error says where to get it and where to put it
(``dataset.source_hint``).
"""

from __future__ import annotations

import ast
import base64
import binascii
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowllm.core.images import EXTENSIONS, image_media_type
from flowllm.core.registry import Registry
from flowllm.datasets.crypto import Cipher, CipherError, decrypt
from flowllm.datasets.gaia import find_dataset_file, read_dataset, select_tasks
from flowllm.datasets.rows import Row, columns_of, read_rows, table_files
from flowllm.datasets.task import DatasetError, Task, ground_truth_of

# The task fields a mapping may name; question and answer are required by the table adapter.
# image: a column holding the question's picture inline (a data: URI or base64, as HLE's image column).
TASK_FIELDS = ("id", "question", "answer", "attachment", "level", "image")
ENCRYPTABLE = ("question", "answer")
_MISSING = object()


@dataclass(frozen=True)
class DatasetSpec:
    """What ``dataset.*`` says, typed (see DatasetConfig in flowllm/config/schema.py)."""

    path: Path
    adapter: str = "gaia"
    format: str = "auto"  # gaia adapter: auto | gaia | standardized
    fields: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    decrypt: Cipher = Cipher.NONE
    encrypted: tuple[str, ...] = ()
    canary_column: str = "canary"
    canary: str | None = None
    skip_nonempty: tuple[str, ...] = ()
    id_prefix: str = "task"
    question_template: str = ""
    source_hint: str = ""
    limit: int | None = None
    levels: tuple[int, ...] | None = None
    task_ids: tuple[str, ...] | None = None

    @classmethod
    def from_config(cls, cfg: Any, path: Path) -> DatasetSpec:
        def get(name: str, default: Any) -> Any:
            value = getattr(cfg, name, default) if not isinstance(cfg, Mapping) else cfg.get(name, default)
            return default if value is None else value

        cipher = Registry.of_enum("dataset.decrypt", Cipher, error=DatasetError).require(str(get("decrypt", "none")))
        levels = getattr(cfg, "levels", None) if not isinstance(cfg, Mapping) else cfg.get("levels")
        task_ids = getattr(cfg, "task_ids", None) if not isinstance(cfg, Mapping) else cfg.get("task_ids")
        limit = getattr(cfg, "limit", None) if not isinstance(cfg, Mapping) else cfg.get("limit")
        canary = getattr(cfg, "canary", None) if not isinstance(cfg, Mapping) else cfg.get("canary")
        return cls(
            path=path,
            adapter=str(get("adapter", "gaia")),
            format=str(get("format", "auto")),
            fields={str(k): str(v) for k, v in dict(get("fields", {})).items()},
            metadata={str(k): str(v) for k, v in dict(get("metadata", {})).items()},
            decrypt=cipher,
            encrypted=tuple(str(f) for f in get("encrypted", ())),
            canary_column=str(get("canary_column", "canary")),
            canary=None if canary is None else str(canary),
            skip_nonempty=tuple(str(c) for c in get("skip_nonempty", ())),
            id_prefix=str(get("id_prefix", "task")),
            question_template=str(get("question_template", "")),
            source_hint=str(get("source_hint", "")),
            limit=limit,
            levels=None if levels is None else tuple(int(v) for v in levels),
            task_ids=None if task_ids is None else tuple(str(t) for t in task_ids),
        )


Adapter = Callable[[DatasetSpec], list[Task]]


# -- gaia ---------------------------------------------------------------------------------------------------


def _gaia(spec: DatasetSpec) -> list[Task]:
    if not spec.path.exists() and spec.source_hint:
        raise DatasetError(f"dataset '{spec.path}' does not exist. {spec.source_hint}")
    tasks = read_dataset(spec.path, spec.format)
    if spec.metadata:  # GAIA keeps its own metadata; extra mapped names are read from the same rows' metadata
        tasks = [_with_metadata(t, spec.metadata) for t in tasks]
    return tasks


def _with_metadata(task: Task, mapping: Mapping[str, str]) -> Task:
    extra = {name: lookup(task.metadata, column) for name, column in mapping.items()}
    meta = {**task.metadata, **{k: v for k, v in extra.items() if v is not _MISSING}}
    return Task(task.task_id, task.question, task.level, task.ground_truth, task.file_name, task.dataset_dir, meta)


# -- table --------------------------------------------------------------------------------------------------


def _parse_text_object(value: str) -> Any:
    """A cell holding an object as text: JSON, else a Python literal (SimpleQA writes ``{'topic': ...}``)."""
    text = value.strip()
    if not text or text[0] not in "{[":
        return _MISSING
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _MISSING


def lookup(values: Mapping[str, Any], path: str) -> Any:
    """``values[path]``, or a dotted path into nested objects; ``_MISSING`` when a part is absent."""
    if path in values:
        return values[path]
    current: Any = values
    for part in path.split("."):
        if isinstance(current, str):
            current = _parse_text_object(current)
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def _text(value: Any) -> str | None:
    if value is None or value is _MISSING:
        return None
    if isinstance(value, float) and value != value:  # NaN: an empty Parquet/pandas cell
        return None
    return value if isinstance(value, str) else str(value)


def _check_columns(file: Path, columns: list[str], spec: DatasetSpec, needed: dict[str, str]) -> None:
    have = set(columns)
    for what, column in needed.items():
        root = column if column in have else column.split(".")[0]
        if root not in have:
            shown = ", ".join(columns[:12]) + (", ..." if len(columns) > 12 else "")
            raise DatasetError(
                f"{file}: no column '{root}' for {what} (the file's columns: {shown}); this is not the file "
                f"dataset.fields expects, or fix dataset.fields.{what}"
                if what in TASK_FIELDS
                else f"{file}: no column '{root}' for {what} (the file's columns: {shown})"
            )


def _needed_columns(spec: DatasetSpec) -> dict[str, str]:
    needed = {name: spec.fields[name] for name in ("question", "answer", "id") if name in spec.fields}
    if spec.decrypt is not Cipher.NONE and spec.canary is None:
        needed["the canary (dataset.canary_column)"] = spec.canary_column
    return needed


def _table(spec: DatasetSpec) -> list[Task]:
    if "question" not in spec.fields:
        raise DatasetError("dataset.adapter=table needs dataset.fields.question (the column holding the question)")
    unknown = sorted(set(spec.fields) - set(TASK_FIELDS))
    if unknown:
        raise DatasetError(f"dataset.fields: unknown task field '{unknown[0]}' (known: {', '.join(TASK_FIELDS)})")
    bad = sorted(set(spec.encrypted) - set(ENCRYPTABLE))
    if bad:
        raise DatasetError(f"dataset.encrypted: '{bad[0]}' cannot be encrypted (only {', '.join(ENCRYPTABLE)})")
    if not spec.path.exists():
        hint = f" {spec.source_hint}" if spec.source_hint else " Point dataset.path at the benchmark's file."
        raise DatasetError(f"dataset '{spec.path}' does not exist.{hint}")
    files = table_files(spec.path)
    folder = spec.path if spec.path.is_dir() else spec.path.parent
    needed = _needed_columns(spec)
    tasks: list[Task] = []
    number = 0
    for file in files:
        header = columns_of(file)
        if header is not None:
            _check_columns(file, header, spec, needed)
        for row in read_rows(file):
            number += 1
            if header is None:
                _check_columns(file, list(row.values), spec, needed)
            task = _table_row(row, number, folder, spec)
            if task is not None:
                tasks.append(task)
    return tasks


def _table_row(row: Row, number: int, folder: Path, spec: DatasetSpec) -> Task | None:
    values = row.values
    for column in spec.skip_nonempty:
        if _text(lookup(values, column)):
            return None
    mapped = {name: lookup(values, column) for name, column in spec.fields.items()}
    canary = spec.canary
    if spec.decrypt is not Cipher.NONE and canary is None:
        canary = _text(values.get(spec.canary_column))
        if not canary:
            raise DatasetError(f"{row.where}: the canary column '{spec.canary_column}' is empty")
    for name in spec.encrypted:
        text = _text(mapped.get(name))
        if text:
            assert canary is not None
            try:
                mapped[name] = decrypt(text, canary, spec.decrypt)
            except CipherError as exc:
                raise DatasetError(
                    f"{row.where}: cannot decrypt {name} ({spec.fields[name]}) with the canary: {exc}"
                ) from None
    question = _text(mapped.get("question"))
    if not question or not question.strip():
        raise DatasetError(f"{row.where}: the question ({spec.fields['question']}) is empty")
    task_id = _text(mapped.get("id")) if "id" in spec.fields else f"{spec.id_prefix}-{number:04d}"
    if not task_id or not task_id.strip():
        raise DatasetError(f"{row.where}: the id ({spec.fields.get('id')}) is empty")
    if task_id in (".", "..") or "/" in task_id or "\\" in task_id:
        raise DatasetError(f"{row.where}: id {task_id!r} cannot name a folder")
    level_text = _text(mapped.get("level"))
    level = None
    if level_text not in (None, ""):
        try:
            level = int(float(str(level_text).strip()))
        except ValueError:
            column = spec.fields["level"]
            raise DatasetError(f"{row.where}: level ({column}) must be a number, not {level_text!r}") from None
    metadata = {name: _plain(lookup(values, column)) for name, column in spec.metadata.items()}
    if spec.question_template:
        try:
            question = spec.question_template.format(question=question, **metadata)
        except (KeyError, IndexError, ValueError) as exc:
            raise DatasetError(
                f"dataset.question_template: cannot fill it for {row.where} ({type(exc).__name__}: {exc}); "
                "it may use {question} and the names of dataset.metadata"
            ) from None
    attachment = _text(mapped.get("attachment")) or None
    image = _text(mapped.get("image"))
    if image:
        if attachment:
            raise DatasetError(f"{row.where}: the row has both an attachment and an inline image; map only one")
        attachment = str(inline_image_file(image, f"{row.where}: the image ({spec.fields['image']})"))
    return Task(
        task_id=task_id.strip(),
        question=question,
        level=level,
        ground_truth=ground_truth_of(_text(mapped.get("answer"))),
        file_name=attachment,
        dataset_dir=folder,
        metadata={k: v for k, v in metadata.items() if v is not None},
    )


def inline_image_file(value: str, where: str) -> Path:
    """An inline image (a ``data:`` URI or bare base64) as a file the task's folder gets a copy of, named
    ``image.<ext>``: kept once per content under the system's temporary folder, so a dataset's rows never write
    into the dataset's own folder."""
    text = value.strip()
    if text.startswith("data:"):
        _, _, text = text.partition(",")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise DatasetError(f"{where} is neither a data: URI nor base64") from None
    media_type = image_media_type(data)
    if media_type is None:
        raise DatasetError(f"{where} is not a png, jpeg, gif or webp image")
    folder = Path(tempfile.gettempdir()) / "flowllm-dataset-images" / hashlib.sha256(data).hexdigest()[:32]
    path = folder / f"image.{EXTENSIONS[media_type]}"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    return path


def _plain(value: Any) -> Any:
    """A metadata value as JSON can hold it (Parquet gives numpy-free Python values already)."""
    if value is _MISSING:
        return None
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


# -- the registry -------------------------------------------------------------------------------------------


def _adapter(name: str, loaded: Any) -> Adapter:
    if not callable(loaded):
        raise TypeError(f"expected a function of a DatasetSpec returning a list of Tasks, got {loaded!r}")
    return loaded


# dataset.* names the dataset the run reads: an unknown name is a DatasetError, which `flowllm export` reports.
ADAPTERS: Registry[Adapter] = Registry(
    "dataset.adapter",
    {"gaia": _gaia, "table": _table},
    group="flowllm.dataset_adapters",
    error=DatasetError,
    adapt=_adapter,
)


def source_of(spec: DatasetSpec) -> str:
    """What messages call the dataset: the GAIA file, or the path as given."""
    if spec.adapter == "gaia" and spec.path.exists():
        return str(find_dataset_file(spec.path, spec.format)[0])
    return str(spec.path)


def load_dataset(spec: DatasetSpec) -> list[Task]:
    """Every selected task of the dataset, in file order; ``DatasetError`` (one line) when it cannot be read."""
    adapter = ADAPTERS.require(spec.adapter)
    tasks = adapter(spec)
    _check_unique(tasks, spec)
    if not tasks:
        raise DatasetError(
            f"{spec.path} holds no tasks" + (" (after dataset.skip_nonempty)" if spec.skip_nonempty else "")
        )
    return select_tasks(
        tasks,
        limit=spec.limit,
        levels=spec.levels,
        task_ids=spec.task_ids,
        source=source_of(spec),
    )


def _check_unique(tasks: Iterable[Task], spec: DatasetSpec) -> None:
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise DatasetError(f"{spec.path}: task id '{task.task_id}' appears twice")
        seen.add(task.task_id)
