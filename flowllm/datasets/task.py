"""One task of a dataset, as every adapter yields it, and the error a dataset that cannot be read raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from flowllm.errors import BuildError


class DatasetError(BuildError):
    """The dataset cannot be read; the message says where and how to fix it."""


# Answers that are no ground truth: an empty one, and "?", how GAIA's test split hides its answers.
NO_GROUND_TRUTH: Final = frozenset({"", "?"})


def ground_truth_of(value: Any) -> str | None:
    """A row's answer as the task's ground truth; None (the task is unscored) when the row has none, an empty
    one or a hidden one (``NO_GROUND_TRUTH``)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return None if text.strip() in NO_GROUND_TRUTH else text


@dataclass(frozen=True)
class Task:
    task_id: str
    question: str
    level: int | None
    ground_truth: str | None
    file_name: str | None  # attachment: relative to the dataset folder, or absolute (standardized format)
    dataset_dir: Path
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def attachment(self) -> Path | None:
        if not self.file_name:
            return None
        path = Path(self.file_name)
        return path if path.is_absolute() else self.dataset_dir / path
