"""The store mirror and the readers' local copy (flowllm/rundir/store.py) on fsspec's in-memory filesystem: what a
reader of the store may see while a run writes, and what a copy fetches. The S3 server tests are
tests/experiment/test_store.py."""

from __future__ import annotations

import uuid
from pathlib import Path

from flowllm.rundir.store import RunStore, StoreMirror, local_run, open_store


class Recording(RunStore):
    """A store that remembers the order of the objects put to it."""

    def put(self, blobs: dict[str, bytes]) -> None:
        self.fs.puts = getattr(self.fs, "puts", []) + list(blobs)
        super().put(blobs)


def memory_store() -> RunStore:
    store = open_store(f"memory://runs/{uuid.uuid4().hex}")
    return Recording(url=store.url, fs=store.fs, root=store.root)


def stored(store: RunStore) -> dict[str, bytes]:
    return {rel: store.fs.cat_file(store.key(rel)) for rel in store.objects()}


def test_a_pass_puts_results_last_ledgers_by_whole_lines_and_keeps_scratch_local(tmp_path: Path) -> None:
    store = memory_store()
    task = tmp_path / "tasks" / "t1"
    (task / "turn_001").mkdir(parents=True)
    (task / "workspace").mkdir()
    (task / "result.json").write_text('{"status": "completed"}')
    (task / "turn_001" / "output.json").write_text("{}")
    (task / "workspace" / "scratch.txt").write_text("local only")
    (task / ".result.json.1.2.tmp").write_text('{"stat')
    (tmp_path / ".control").mkdir()
    (tmp_path / ".control" / "state.json").write_text('{"paused": true}')
    (tmp_path / "usage.jsonl").write_text('{"a": 1}\n{"b": ')
    mirror = StoreMirror(store, tmp_path)
    assert mirror.sync() == 3
    assert store.fs.puts[-1] == "tasks/t1/result.json"
    assert stored(store) == {
        "tasks/t1/result.json": b'{"status": "completed"}',
        "tasks/t1/turn_001/output.json": b"{}",
        "usage.jsonl": b'{"a": 1}\n',
    }
    (tmp_path / "usage.jsonl").write_text('{"a": 1}\n{"b": 2}\n')
    (task / "turn_001" / "output.json").unlink()
    assert mirror.sync() == 1  # only what changed; what was removed locally goes from the store too
    assert stored(store) == {"tasks/t1/result.json": b'{"status": "completed"}', "usage.jsonl": b'{"a": 1}\n{"b": 2}\n'}


def test_a_rerun_pulls_what_it_lacks_and_a_reader_fetches_what_changed(tmp_path: Path) -> None:
    store = memory_store()
    store.put({"summary.json": b"{}", "tasks/t1/result.json": b"1", ".hydra/config.yaml": b"old: 1"})
    rerun = tmp_path / "rerun"
    (rerun / ".hydra").mkdir(parents=True)
    (rerun / ".hydra" / "config.yaml").write_text("new: 1")
    (rerun / "summary.json").write_text('{"local": true}')
    assert store.pull_missing(rerun) == ["tasks/t1/result.json"]
    assert (rerun / ".hydra" / "config.yaml").read_text() == "new: 1"  # this session's own
    assert (rerun / "summary.json").read_text() == '{"local": true}'
    cache = tmp_path / "cache"
    copy = local_run(store.url, cache)
    assert (copy / "tasks" / "t1" / "result.json").read_bytes() == b"1"
    store.fs.puts = []
    store.put({"tasks/t1/result.json": b"22"})
    assert local_run(store.url, cache) == copy
    assert (copy / "tasks" / "t1" / "result.json").read_bytes() == b"22"
    assert local_run(tmp_path / "plain") == tmp_path / "plain"  # a folder is a folder
