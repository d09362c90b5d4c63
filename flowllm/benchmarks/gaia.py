"""GAIA: the dataset format and the official scoring rules.

Dataset: a folder with ``metadata.jsonl`` (one task a line: task_id, Question, Level, Final answer, file_name)
and the attachments beside it. Scoring follows GAIA's ``question_scorer``: numbers compare as floats after
dropping ``$``, ``%`` and ``,``; lists (split on ``,`` or ``;``) compare element-wise, each element by the number
or the string rule; strings compare lowercased, without whitespace and punctuation.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from flowllm.engine.errors import FlowError

METADATA = "metadata.jsonl"


class DatasetError(FlowError):
    """The dataset cannot be read; the message says where and how to fix it."""


@dataclass(frozen=True)
class Task:
    task_id: str
    question: str
    level: int | None
    ground_truth: str | None
    file_name: str | None  # attachment, relative to the dataset folder
    dataset_dir: Path

    @property
    def attachment(self) -> Path | None:
        return self.dataset_dir / self.file_name if self.file_name else None


def _task_from_row(row: dict, dataset_dir: Path, where: str) -> Task:
    try:
        task_id = str(row["task_id"])
        question = str(row["Question"])
    except KeyError as exc:
        raise DatasetError(
            f"{where}: missing field {exc.args[0]!r} (GAIA rows need task_id and Question)"
        ) from None
    level = row.get("Level")
    return Task(
        task_id=task_id,
        question=question,
        level=int(level) if level not in (None, "") else None,
        ground_truth=None if row.get("Final answer") is None else str(row["Final answer"]),
        file_name=row.get("file_name") or None,
        dataset_dir=dataset_dir,
    )


def load_tasks(
    path: Path | str,
    *,
    limit: int | None = None,
    levels: Iterable[int] | None = None,
    task_ids: Iterable[str] | None = None,
) -> list[Task]:
    """Read a GAIA-format folder and select tasks. Raises DatasetError with the file and line when malformed."""
    folder = Path(path)
    if not folder.is_dir():
        raise DatasetError(
            f"dataset folder '{folder}' does not exist. Put a GAIA-format folder there (metadata.jsonl and the "
            "attachments) or point dataset.path at one."
        )
    meta = folder / METADATA
    if not meta.is_file():
        raise DatasetError(f"'{folder}' has no {METADATA}: it is not a GAIA-format dataset folder.")
    tasks: list[Task] = []
    seen: set[str] = set()
    with meta.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{meta}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
            task = _task_from_row(row, folder, where)
            if task.task_id in seen:
                raise DatasetError(f"{where}: task_id '{task.task_id}' appears twice")
            seen.add(task.task_id)
            tasks.append(task)
    if not tasks:
        raise DatasetError(f"{meta} holds no tasks")
    if task_ids:
        wanted = [str(t) for t in task_ids]
        unknown = sorted(set(wanted) - seen)
        if unknown:
            raise DatasetError(f"dataset.task_ids names tasks that are not in {meta}: {', '.join(unknown)}")
        tasks = [t for t in tasks if t.task_id in set(wanted)]
    if levels:
        keep = {int(level) for level in levels}
        tasks = [t for t in tasks if t.level in keep]
    if limit is not None:
        tasks = tasks[: max(limit, 0)]
    return tasks


# -- scoring ----------------------------------------------------------------------------------------------


def normalize_number_str(number_str: str) -> float | None:
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
            elif normalize_str(ma_elem, remove_punct=False) != normalize_str(gt_elem, remove_punct=False):
                return False
        return True
    return normalize_str(model_answer) == normalize_str(ground_truth)
