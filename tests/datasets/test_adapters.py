"""Each shipped adapter on its bundled fixture, composed exactly as ``+experiment=<name>_sample`` composes it,
and the bad inputs a user meets: a wrong canary, a file whose columns are another benchmark's, a missing file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st

import flowllm.app  # noqa: F401  registers the structured configs
from flowllm.datasets.adapters import DatasetSpec, load_dataset
from flowllm.datasets.crypto import Cipher, CipherError, decrypt, encrypt
from flowllm.datasets.gaia import load_tasks
from flowllm.datasets.task import DatasetError, Task
from flowllm.setup.build import resolve_path

ROOT = Path(__file__).resolve().parents[2]


def spec_of(experiment: str, *overrides: str) -> DatasetSpec:
    with initialize_config_dir(str(ROOT / "flowllm" / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={experiment}", *overrides])
    return DatasetSpec.from_config(cfg.dataset, resolve_path(cfg.dataset.path, "dataset.path"))


def load(experiment: str, *overrides: str) -> list[Task]:
    return load_dataset(spec_of(experiment, *overrides))


def test_browsecomp_rows_are_decrypted_with_their_canary() -> None:
    tasks = load("browsecomp_sample")
    assert [t.task_id for t in tasks] == ["browsecomp-0001", "browsecomp-0002", "browsecomp-0003"]
    assert tasks[0].question.startswith("A lighthouse keeper's logbook")
    assert [t.ground_truth for t in tasks] == ["April", "The Heron Waltz", "f2"]
    assert tasks[0].metadata == {"topic": "History"}
    # The file itself holds only ciphertext.
    raw = (ROOT / "flowllm" / "data/browsecomp_sample/browse_comp_test_set.csv").read_text()
    assert "lighthouse" not in raw and "Heron" not in raw


def test_xbench_rows_are_decrypted_with_the_plain_canary_key() -> None:
    tasks = load("xbench_deepsearch_sample")
    assert [t.task_id for t in tasks] == ["1", "2", "3"]
    assert "paper lanterns" in tasks[0].question
    assert tasks[2].ground_truth == "112"


def test_simpleqa_metadata_is_read_from_its_python_literal_column() -> None:
    tasks = load("simpleqa_sample")
    assert len(tasks) == 3
    assert tasks[0].metadata == {"topic": "Geography", "answer_type": "Place"}
    assert tasks[1].ground_truth == "1931"


def test_frames_reads_the_tsv() -> None:
    tasks = load("frames_sample")
    assert [t.task_id for t in tasks] == ["frames-0001", "frames-0002", "frames-0003"]
    assert tasks[1].ground_truth == "Brandmoor"
    assert tasks[0].metadata["reasoning_types"] == "Numerical reasoning | Temporal reasoning"


def test_hle_is_the_text_only_subset_by_default() -> None:
    pytest.importorskip("pyarrow")
    tasks = load("hle_sample")
    assert [t.task_id[-2:] for t in tasks] == ["67", "68", "6a"]  # the image question (…69) is left out
    assert tasks[1].metadata == {"category": "Chemistry", "answer_type": "multipleChoice", "subject": "Chemistry"}
    every = load("hle_sample", "dataset.skip_nonempty=[]")
    assert len(every) == 4
    # The image question gets its picture (the row's data: URI) as its attachment, a PNG the task folder gets.
    pictured = next(t for t in every if t.task_id.endswith("69"))
    assert pictured.attachment is not None and pictured.attachment.name == "image.png"
    assert pictured.attachment.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert all(t.attachment is None for t in every if t is not pictured)


def test_an_inline_image_that_is_no_image_is_one_line_naming_the_row(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "question": "q?", "answer": "x", "image": "data:image/png;base64,aGVsbG8="}\n')
    spec = DatasetSpec(path=rows, adapter="table", fields={"id": "id", "question": "question", "image": "image"})
    with pytest.raises(DatasetError, match=r"rows\.jsonl.*image \(image\) is not a png, jpeg, gif or webp image"):
        load_dataset(spec)


def test_webwalkerqa_questions_name_their_start_page() -> None:
    tasks = load("webwalkerqa_sample")
    assert tasks[0].question.endswith("Start from the website https://conference.example.org.")
    assert tasks[1].metadata["difficulty"] == "medium" and tasks[1].metadata["domain"] == "game"


def test_gaia_behind_the_contract_reads_as_the_gaia_loader_does() -> None:
    spec = spec_of("gaia_sample")
    through_contract = load_dataset(spec)
    direct = load_tasks(spec.path)
    assert through_contract == direct
    assert [t.level for t in direct] == [1, 2, 3]
    assert through_contract[0].attachment is not None and through_contract[0].attachment.resolve() == (
        ROOT / "flowllm" / "data/gaia_sample/shelf.csv"
    )


def test_a_wrong_canary_is_one_line_naming_the_row() -> None:
    with pytest.raises(DatasetError) as err:
        load("browsecomp_sample", "dataset.canary=not-the-canary")
    message = str(err.value)
    assert "\n" not in message
    assert "browse_comp_test_set.csv: row 1" in message and "wrong canary" in message


def test_columns_of_another_benchmark_are_one_line_naming_the_column() -> None:
    with pytest.raises(DatasetError) as err:
        load("frames_sample", "dataset.path=data/browsecomp_sample/browse_comp_test_set.csv")
    message = str(err.value)
    assert "\n" not in message
    assert "no column 'Prompt' for question" in message and "problem, answer, problem_topic, canary" in message


def test_a_missing_file_says_where_to_get_it_and_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        load("browsecomp", f"dataset.path={tmp_path / 'nowhere.csv'}")
    message = str(err.value)
    assert "\n" not in message
    assert "browse_comp_test_set.csv" in message and "data/browsecomp/" in message


def test_a_folder_of_jsonl_and_parquet_files_reads_every_file(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_text(json.dumps({"q": "one?", "a": "1", "info": {"kind": "x"}}) + "\n")
    pq.write_table(pa.Table.from_pylist([{"q": "two?", "a": "2", "info": {"kind": "y"}}]), tmp_path / "b.parquet")
    spec = DatasetSpec(
        tmp_path, adapter="table", fields={"question": "q", "answer": "a"}, metadata={"kind": "info.kind"}
    )
    tasks = load_dataset(spec)
    assert [(t.task_id, t.question, t.metadata["kind"]) for t in tasks] == [
        ("task-0001", "one?", "x"),
        ("task-0002", "two?", "y"),
    ]


def test_duplicate_ids_and_empty_questions_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([["id", "q", "a"], ["x", "one?", "1"], ["x", "two?", "2"]])
    spec = DatasetSpec(path, adapter="table", fields={"id": "id", "question": "q", "answer": "a"})
    with pytest.raises(DatasetError, match="task id 'x' appears twice"):
        load_dataset(spec)
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([["id", "q", "a"], ["x", "", "1"]])
    with pytest.raises(DatasetError, match=r"d.csv: row 1: the question \(q\) is empty"):
        load_dataset(spec)


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1, max_size=300).filter(lambda s: "\x00" not in s), st.text(min_size=1, max_size=80))
def test_each_cipher_round_trips(plain: str, canary: str) -> None:
    printable = "".join(c for c in plain if ord(c) >= 32 or c in "\n\t")
    if not printable:
        return
    for cipher in (Cipher.SHA256_XOR, Cipher.XOR):
        assert decrypt(encrypt(printable, canary, cipher), canary, cipher) == printable


def test_decrypting_plain_text_says_the_file_may_be_decrypted_already() -> None:
    with pytest.raises(CipherError, match="already decrypted"):
        decrypt("What is the capital?", "canary", Cipher.SHA256_XOR)
