"""Both dataset layouts, task selection, attachments in the prompt, and the errors a user can hit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowllm.datasets.gaia import (
    attachment_kind,
    load_tasks,
    read_dataset,
    task_prompt,
)
from flowllm.datasets.task import DatasetError
from tests.experiment.helpers import CSV_TASK, GAIA, LIST_TASK, MISSING_FILE_TASK, STANDARDIZED, WRONG_TASK


def test_gaia_metadata_format() -> None:
    tasks = load_tasks(GAIA)
    assert [t.level for t in tasks] == [1, 1, 2, 2, 3]
    csv_task = tasks[0]
    assert csv_task.task_id == CSV_TASK
    assert csv_task.ground_truth == "3"
    assert csv_task.attachment == GAIA / f"{CSV_TASK}.csv" and csv_task.attachment.is_file()
    assert "Steps" in csv_task.metadata["Annotator Metadata"]
    by_id = {t.task_id: t for t in tasks}
    assert by_id[LIST_TASK].attachment is None  # "file_name": "" means no attachment
    missing = by_id[MISSING_FILE_TASK].attachment
    assert missing is not None and not missing.exists()  # reported when the task runs, not at load time


def test_standardized_format() -> None:
    tasks = {t.task_id: t for t in load_tasks(STANDARDIZED)}
    assert list(tasks) == ["std-001", "std-002", "std-003"]
    # A converter's project-relative path ("data/gaia-val/lines.txt") falls back to the file in the folder.
    assert tasks["std-001"].attachment == STANDARDIZED / "lines.txt"
    assert tasks["std-001"].level == 2  # metadata.Level as a string
    assert tasks["std-002"].level == 1 and tasks["std-002"].attachment is None  # metadata.level
    assert tasks["std-003"].attachment == STANDARDIZED / "files" / "words.txt"
    assert tasks["std-003"].level is None
    assert tasks["std-003"].question == "Name the file's first word." and tasks["std-003"].ground_truth == "alpha"


def test_standardized_absolute_file_path(tmp_path: Path) -> None:
    attachment = tmp_path / "elsewhere" / "data.csv"
    attachment.parent.mkdir()
    attachment.write_text("a,b\n1,2\n")
    folder = tmp_path / "ds"
    folder.mkdir()
    row = {"task_id": "x", "task_question": "q", "ground_truth": "1", "file_path": str(attachment)}
    (folder / "standardized_data.jsonl").write_text(json.dumps(row) + "\n")
    (task,) = load_tasks(folder)
    assert task.attachment == attachment


def test_format_detection_and_explicit_choice(tmp_path: Path) -> None:
    folder = tmp_path / "both"
    folder.mkdir()
    (folder / "metadata.jsonl").write_text(json.dumps({"task_id": "g", "Question": "q", "Level": 1}) + "\n")
    (folder / "standardized_data.jsonl").write_text(json.dumps({"task_id": "s", "task_question": "q"}) + "\n")
    assert [t.task_id for t in load_tasks(folder)] == ["g"]  # GAIA's own file wins
    assert [t.task_id for t in load_tasks(folder, fmt="standardized")] == ["s"]
    assert [t.task_id for t in load_tasks(folder / "standardized_data.jsonl")] == ["s"]  # a file path works too
    with pytest.raises(DatasetError, match=r"dataset.format must be one of auto, gaia, standardized"):
        load_tasks(folder, fmt="csv")
    only_std = tmp_path / "std"
    only_std.mkdir()
    (only_std / "standardized_data.jsonl").write_text((folder / "standardized_data.jsonl").read_text())
    with pytest.raises(DatasetError, match=r"has no metadata.jsonl"):
        load_tasks(only_std, fmt="gaia")


def test_selection_by_level_limit_and_ids() -> None:
    assert [t.level for t in load_tasks(GAIA, levels=[2, 3])] == [2, 2, 3]
    assert [t.task_id for t in load_tasks(GAIA, levels=[2, 3], limit=1)] == [MISSING_FILE_TASK]
    # Named tasks keep the dataset's order, whatever order they were named in.
    assert [t.task_id for t in load_tasks(GAIA, task_ids=[WRONG_TASK, CSV_TASK])] == [CSV_TASK, WRONG_TASK]
    with pytest.raises(DatasetError, match=r"not in .*metadata.jsonl: nope"):
        load_tasks(GAIA, task_ids=["nope"])


def test_prompt_announces_the_attachment_by_type_and_path() -> None:
    csv_task = load_tasks(GAIA, task_ids=[CSV_TASK])[0]
    prompt = task_prompt(csv_task)
    assert prompt.startswith("The attached inventory")
    assert f"Attached file (CSV table): `{CSV_TASK}.csv`, in your working directory." in prompt
    assert "Attached" not in task_prompt(load_tasks(GAIA, task_ids=[LIST_TASK])[0])
    assert attachment_kind("a.XLSX") == "Excel spreadsheet"
    assert attachment_kind("clip.mp3") == "MP3 audio"
    assert attachment_kind("blob.xyz") == "XYZ file"
    assert attachment_kind("README") == "file"


def _write(folder: Path, text: str, name: str = "metadata.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"metadata.jsonl is empty: it holds no tasks"),
        ("\n\n  \n", r"metadata.jsonl is empty"),
        ('{"task_id": "a", "Question": "q"}\n\n{oops\n', r"metadata.jsonl:3: not valid JSON"),
        ('{"task_id": "a", "Question": "q"}\n[1, 2]\n', r"metadata.jsonl:2: expected a JSON object, got list"),
        ('{"task_id": "a", "Question": "q", "Level": "hard"}\n', r"metadata.jsonl:1: Level must be a whole number"),
        ('{"task_id": "a", "Question": "q"}\n{"task_id": "a", "Question": "r"}\n', r":2: task_id 'a' appears twice"),
        ('{"Question": "q"}\n', r"metadata.jsonl:1: missing field 'task_id'"),
        ('{"task_id": " ", "Question": "q"}\n', r"metadata.jsonl:1: task_id is empty"),
    ],
)
def test_malformed_metadata_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        read_dataset(_write(tmp_path / "d", text))


def test_malformed_standardized_rows(tmp_path: Path) -> None:
    folder = _write(tmp_path / "s", '{"task_id": "a", "Question": "q"}\n', "standardized_data.jsonl")
    with pytest.raises(DatasetError, match=r"standardized_data.jsonl:1: missing field 'task_question'"):
        read_dataset(folder)
    folder = _write(
        tmp_path / "m", '{"task_id": "a", "task_question": "q", "metadata": [1]}\n', "standardized_data.jsonl"
    )
    with pytest.raises(DatasetError, match=r":1: metadata must be a JSON object"):
        read_dataset(folder)


def test_non_utf8_metadata(tmp_path: Path) -> None:
    folder = tmp_path / "latin"
    folder.mkdir()
    (folder / "metadata.jsonl").write_bytes('{"task_id": "a", "Question": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DatasetError, match=r"not UTF-8"):
        read_dataset(folder)


def test_missing_folder_says_where_to_put_gaia_and_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        load_tasks(tmp_path / "gaia" / "2023" / "validation")
    message = str(info.value)
    assert "\n" not in message  # one line on the terminal
    assert f"dataset folder '{tmp_path / 'gaia' / '2023' / 'validation'}' does not exist" in message
    assert "metadata.jsonl" in message and "dataset.path" in message and "FLOWLLM_GAIA_DIR" in message
    assert "gaia-benchmark/GAIA" in message and "2023/validation" in message
    with pytest.raises(DatasetError, match=r"neither metadata.jsonl nor standardized_data.jsonl"):
        load_tasks(tmp_path)
