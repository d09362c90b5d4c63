"""GAIA: the dataset formats, task selection and the official scoring rules.

Two dataset layouts are read, both a folder of attachments beside one JSON-lines file:

* GAIA's own ``metadata.jsonl`` (as downloaded from the Hugging Face hub, ``gaia-benchmark/GAIA``,
  ``2023/validation``): ``task_id``, ``Question``, ``Level``, ``Final answer``, ``file_name``.
* ``standardized_data.jsonl``, the form other agent frameworks convert benchmarks to: ``task_id``,
  ``task_question``, ``ground_truth``, ``file_path`` (absolute, or relative to the folder) and ``metadata``
  (a mapping; its ``Level`` or ``level`` is the task's level).

Scoring follows GAIA's ``question_scorer``: numbers compare as floats after dropping ``$``, ``%`` and ``,``;
lists (split on ``,`` or ``;``) compare element-wise with the same length, each element by the number or the
string rule; strings compare lowercased, without whitespace and punctuation.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flowllm.core.registry import Registry
from flowllm.datasets.task import DatasetError, Task, ground_truth_of

METADATA = "metadata.jsonl"
STANDARDIZED = "standardized_data.jsonl"
# dataset.format of the gaia adapter: auto tells the two layouts apart by the file's name.
FORMATS: Registry[str] = Registry(
    "dataset.format", {f: f for f in ("auto", "gaia", "standardized")}, error=DatasetError
)
# Where the gaia experiment looks by default, and the variable that moves it (conf/experiment/gaia.yaml).
DEFAULT_GAIA_DIR = "data/gaia/2023/validation"
GAIA_DIR_ENV = "FLOWLLM_GAIA_DIR"
GAIA_HINT = (
    f"GAIA is gated on the Hugging Face hub: accept the terms of gaia-benchmark/GAIA and download its "
    f"2023/validation folder into {DEFAULT_GAIA_DIR}"
)


# -- attachments in the prompt ------------------------------------------------------------------------------

_KINDS = {
    "csv": "CSV table",
    "tsv": "TSV table",
    "xlsx": "Excel spreadsheet",
    "xls": "Excel spreadsheet",
    "json": "JSON file",
    "jsonld": "JSON-LD file",
    "jsonl": "JSON lines file",
    "txt": "text file",
    "md": "Markdown text",
    "py": "Python source file",
    "pdf": "PDF document",
    "docx": "Word document",
    "pptx": "PowerPoint presentation",
    "xml": "XML file",
    "pdb": "Protein Data Bank file",
    "zip": "ZIP archive",
    "png": "PNG image",
    "jpg": "JPEG image",
    "jpeg": "JPEG image",
    "gif": "GIF image",
    "mp3": "MP3 audio",
    "wav": "WAV audio",
    "m4a": "M4A audio",
    "mp4": "MP4 video",
    "mov": "MOV video",
}


def attachment_kind(name: str) -> str:
    """A human name for a file's type, from its extension (what a model needs to pick a tool)."""
    ext = Path(name).suffix.lstrip(".").lower()
    return _KINDS.get(ext, f"{ext.upper()} file" if ext else "file")


def task_prompt(task: Task) -> str:
    """The user message of a task: the question, then the attachment by type and path, if any."""
    prompt = task.question.strip()
    if task.file_name:
        name = Path(task.file_name).name
        prompt += f"\n\nAttached file ({attachment_kind(name)}): `{name}`, in your working directory."
    return prompt


# -- loading --------------------------------------------------------------------------------------------------


def _level(value: Any, where: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise DatasetError(f"{where}: Level must be a whole number, not {value!r}") from None


def _safe_attachment(name: str, folder: Path, where: str) -> str:
    """An attachment path that stays inside the dataset folder, relative to it; else a DatasetError.

    A row naming ``../../etc/passwd`` or ``/root/.ssh/id_rsa`` would have that file copied into the task's
    workspace for the model to read. An absolute path into the dataset folder is kept (made relative), and one
    elsewhere whose file name sits in the folder is taken from there, as converters' paths usually mean.
    """
    # Lexical, not resolved: a dataset's own symlinks (a Hugging Face snapshot links every file into its blob
    # store) are the dataset's business; what a row may not do is name a path that leaves the folder.
    root = Path(os.path.abspath(folder))
    candidate = Path(os.path.normpath(root / name))
    if candidate.is_relative_to(root) and candidate != root:
        return str(candidate.relative_to(root))
    if Path(name).is_absolute() and (root / Path(name).name).is_file():
        return Path(name).name
    raise DatasetError(
        f"{where}: attachment '{name}' is outside the dataset folder; attachments must be files in '{folder}'"
    )


def _gaia_row(row: dict[str, Any], folder: Path, where: str) -> Task:
    missing = [k for k in ("task_id", "Question") if k not in row]
    if missing:
        raise DatasetError(f"{where}: missing field {missing[0]!r} (GAIA rows need task_id and Question)")
    answer = row.get("Final answer")
    return Task(
        task_id=str(row["task_id"]),
        question=str(row["Question"]),
        level=_level(row.get("Level"), where),
        ground_truth=ground_truth_of(answer),
        file_name=_safe_attachment(str(row["file_name"]), folder, where) if row.get("file_name") else None,
        dataset_dir=folder,
        metadata={k: v for k, v in row.items() if k == "Annotator Metadata"},
    )


def _standardized_row(row: dict[str, Any], folder: Path, where: str) -> Task:
    missing = [k for k in ("task_id", "task_question") if k not in row]
    if missing:
        raise DatasetError(f"{where}: missing field {missing[0]!r} (standardized rows need task_id and task_question)")
    meta = row.get("metadata") or {}
    if not isinstance(meta, dict):
        raise DatasetError(f"{where}: metadata must be a JSON object, not {type(meta).__name__}")
    answer = row.get("ground_truth")
    file_path = str(row["file_path"]) if row.get("file_path") else None
    # Converters often write paths relative to their own project ("data/gaia-val/x.pdf"): the file itself
    # sits in the dataset folder, so fall back to its name there.
    if (
        file_path
        and not Path(file_path).is_absolute()
        and not (folder / file_path).exists()
        and (folder / Path(file_path).name).exists()
    ):
        file_path = Path(file_path).name
    if file_path and not Path(file_path).is_absolute():
        # The standardized format names attachments by absolute path by design; a relative one must stay inside.
        file_path = _safe_attachment(file_path, folder, where)
    return Task(
        task_id=str(row["task_id"]),
        question=str(row["task_question"]),
        level=_level(meta.get("Level", meta.get("level")), where),
        ground_truth=ground_truth_of(answer),
        file_name=file_path,
        dataset_dir=folder,
        metadata=meta,
    )


def find_dataset_file(path: Path, fmt: str = "auto") -> tuple[Path, str]:
    """The JSON-lines file of a dataset folder (or the file itself) and its format."""
    FORMATS.require(fmt)
    if path.is_file():
        if fmt == "auto":
            fmt = "standardized" if path.name == STANDARDIZED else "gaia"
        return path, fmt
    if not path.is_dir():
        raise DatasetError(
            f"dataset folder '{path}' does not exist. Put {METADATA} (or {STANDARDIZED}) and the attachments "
            f"there, or point dataset.path (or ${GAIA_DIR_ENV}) at such a folder. {GAIA_HINT}."
        )
    candidates = {"gaia": path / METADATA, "standardized": path / STANDARDIZED}
    if fmt != "auto":
        if not candidates[fmt].is_file():
            raise DatasetError(f"'{path}' has no {candidates[fmt].name} (dataset.format={fmt})")
        return candidates[fmt], fmt
    for name, candidate in candidates.items():
        if candidate.is_file():
            return candidate, name
    raise DatasetError(f"'{path}' has neither {METADATA} nor {STANDARDIZED}: it is not a GAIA-format dataset folder")


def read_dataset(path: Path | str, fmt: str = "auto") -> list[Task]:
    """Every task of a dataset, in file order. Raises DatasetError naming the file and line when malformed."""
    source, fmt = find_dataset_file(Path(path), fmt)
    folder = source.parent
    parse = _gaia_row if fmt == "gaia" else _standardized_row
    tasks: list[Task] = []
    seen: set[str] = set()
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
        task = parse(row, folder, where)
        if not task.task_id.strip():
            raise DatasetError(f"{where}: task_id is empty")
        if task.task_id in seen:
            raise DatasetError(f"{where}: task_id '{task.task_id}' appears twice")
        seen.add(task.task_id)
        tasks.append(task)
    if not tasks:
        raise DatasetError(f"{source} is empty: it holds no tasks")
    return tasks


def select_tasks(
    tasks: list[Task],
    *,
    limit: int | None = None,
    levels: Iterable[int] | None = None,
    task_ids: Iterable[str] | None = None,
    source: str = "the dataset",
) -> list[Task]:
    """Keep the named tasks (in dataset order), then those of the given levels, then the first ``limit``."""
    if task_ids:
        wanted = {str(t) for t in task_ids}
        unknown = sorted(wanted - {t.task_id for t in tasks})
        if unknown:
            raise DatasetError(f"dataset.task_ids names tasks that are not in {source}: {', '.join(unknown)}")
        tasks = [t for t in tasks if t.task_id in wanted]
    if levels:
        keep = {int(level) for level in levels}
        tasks = [t for t in tasks if t.level in keep]
    if limit is not None:
        tasks = tasks[: max(limit, 0)]
    return tasks


def load_tasks(
    path: Path | str,
    *,
    limit: int | None = None,
    levels: Iterable[int] | None = None,
    task_ids: Iterable[str] | None = None,
    fmt: str = "auto",
) -> list[Task]:
    """Read a GAIA-format dataset (either layout) and select tasks."""
    source, _ = find_dataset_file(Path(path), fmt)
    return select_tasks(read_dataset(path, fmt), limit=limit, levels=levels, task_ids=task_ids, source=str(source))


# -- scoring --------------------------------------------------------------------------------------------------


def normalize_number_str(number_str: str) -> float | None:
    """A number with ``$``, ``%`` and ``,`` dropped, or None when what is left is not a number."""
    cleaned = number_str
    for char in ("$", "%", ","):
        cleaned = cleaned.replace(char, "")
    try:
        return float(cleaned.strip())
    except ValueError:
        return None


def split_string(s: str, char_list: Iterable[str] = (",", ";")) -> list[str]:
    pattern = f"[{''.join(re.escape(c) for c in char_list)}]"
    return re.split(pattern, s)


def normalize_str(input_str: str, remove_punct: bool = True) -> str:
    no_spaces = re.sub(r"\s", "", input_str)
    if remove_punct:
        return no_spaces.lower().translate(str.maketrans("", "", string.punctuation))
    return no_spaces.lower()


def _is_float(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def question_scorer(model_answer: str | None, ground_truth: str | None) -> bool:
    """GAIA's scoring rule: True when ``model_answer`` matches ``ground_truth``."""
    if model_answer is None or ground_truth is None:
        return False
    model_answer = str(model_answer)
    ground_truth = str(ground_truth)
    if _is_float(ground_truth):
        value = normalize_number_str(model_answer)
        return value is not None and value == float(ground_truth)
    if any(char in ground_truth for char in (",", ";")):
        gt_elems = split_string(ground_truth)
        ma_elems = split_string(model_answer)
        if len(gt_elems) != len(ma_elems):
            return False
        for ma_elem, gt_elem in zip(ma_elems, gt_elems, strict=True):
            if _is_float(gt_elem):
                if normalize_number_str(ma_elem) != float(gt_elem):
                    return False
            # Inside a list GAIA keeps punctuation (a decimal point or a hyphen can tell two items apart).
            elif normalize_str(ma_elem, remove_punct=False) != normalize_str(gt_elem, remove_punct=False):
                return False
        return True
    return normalize_str(model_answer) == normalize_str(ground_truth)
