"""What a replay reads per node, fast and the same: ``TurnDirs`` names exactly what ``RunLayout`` names,
``read_saved`` reads exactly what ``Path.read_bytes`` reads, and the call node's record is read once per turn."""

from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace

import pytest

from flowllm.config.provider_schema import ProviderConfig
from flowllm.core.interfaces import CallContext
from flowllm.engine import TurnContext
from flowllm.engine.blobs import BlobStore
from flowllm.engine.recorder import Redactor, read_json
from flowllm.providers.replay import READ_CHUNK, build_replay_provider, read_saved
from flowllm.run.replay_audit import ReplayAudit
from flowllm.rundir.digests import Digests, digest, node_key
from flowllm.rundir.layout import DIGESTS_FILE, OUTPUT_FILE, RunLayout, TurnDirs, nested_scope, subagent_scope
from tests.replay.runs import CLEAN_TASK, FixtureRuns


@pytest.mark.parametrize(
    ("task_id", "scope", "epoch"),
    [
        ("plain-task", "", None),
        ("plain-task", "", 3),
        ("a/b: an id that cannot name a folder", "", None),
        ("plain-task", subagent_scope(2, "browser", "call_7"), None),
        ("plain-task", nested_scope(subagent_scope(1, "coder", "c1"), 4, "compaction"), 2),
    ],
)
def test_node_files_are_the_layouts_paths(tmp_path: Path, task_id: str, scope: str, epoch: int | None) -> None:
    layout = RunLayout(tmp_path / "run")
    dirs = TurnDirs(layout)
    assert dirs.conversation(task_id, scope, epoch) == str(layout.conversation(task_id, scope, epoch))
    for turn in (1, 12):
        assert dirs.turn(task_id, turn, scope, epoch) == str(layout.turn(task_id, turn, scope, epoch))
        for index, name in ((3, "call_model"), (11, "dispatch_tools")):
            expected = str(layout.node(task_id, turn, index, name, scope, epoch) / OUTPUT_FILE)
            assert dirs.node_file(task_id, turn, index, name, OUTPUT_FILE, scope, epoch) == expected


def test_it_keeps_a_bounded_number_of_conversations(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    dirs = TurnDirs(layout, kept=4)
    for task in range(10):
        for turn in (1, 2):
            assert dirs.turn(f"t{task}", turn) == str(layout.turn(f"t{task}", turn))
    assert len(dirs) <= 4
    # A conversation asked again after the cache started over is spelled the same.
    assert dirs.turn("t0", 1) == str(layout.turn("t0", 1))


@pytest.mark.parametrize("size", [0, 1, READ_CHUNK - 1, READ_CHUNK, 3 * READ_CHUNK + 5])
def test_read_saved_reads_whole_files(tmp_path: Path, size: int) -> None:
    path = tmp_path / "output.json"
    path.write_bytes(bytes(i % 251 for i in range(size)))
    assert read_saved(str(path)) == path.read_bytes()


def test_read_saved_raises_os_errors_as_read_bytes_does(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_saved(str(tmp_path / "absent.json"))
    with pytest.raises(OSError):
        read_saved(str(tmp_path))  # a folder where a file was expected


async def test_the_saved_call_output_a_send_read_is_given_once(runs: FixtureRuns) -> None:
    run_dir = runs.original.run_dir
    provider = build_replay_provider(
        ProviderConfig(name="replay", protocol="replay", model="replay", run_dir=str(run_dir))
    )
    path = TurnDirs(RunLayout(run_dir)).node_file(CLEAN_TASK, 1, 3, "call_model", OUTPUT_FILE)
    key = (CLEAN_TASK, "", None, 1, "03_call_model")  # the node's record, as the audit names it
    saved = read_json(Path(path))
    assert await provider.send(saved["raw_request"], context=CallContext(CLEAN_TASK, 1)) == saved["raw_response"]
    assert provider.saved_output(key) is None  # kept only for an audit that asked
    take = provider.output_taker()
    assert take(key) is None  # no send read it since
    assert await provider.send(saved["raw_request"], context=CallContext(CLEAN_TASK, 1)) == saved["raw_response"]
    assert take(key) == Path(path).read_bytes()
    assert take(key) is None  # given once: the audit reads it, nobody keeps it
    await provider.aclose()


def test_the_audit_compares_with_the_output_the_provider_gave(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    dumps = Redactor(environ={}).dumps
    node = SimpleNamespace(index=3, name="call_model", folder="03_call_model")
    given = {("t", "", None, 1, "03_call_model"): dumps({"text": "saved"})}
    # No file on disk: the given bytes are the saved output, taken once.
    audit = ReplayAudit(layout, dumps, saved_outputs=lambda p: given.pop(p, None))
    audit.on_node(TurnContext("t", 1), node, {}, {"text": "saved"}, {})  # type: ignore[arg-type]
    assert audit.verdict("t", missed=False) == {"status": "exact"}
    assert not given
    # Nothing given and no file: unverified, as before.
    audit.on_node(TurnContext("u", 1), node, {}, {"text": "saved"}, {})  # type: ignore[arg-type]
    assert audit.verdict("u", missed=False) == {"status": "unverified"}
    given["v", "", None, 1, "03_call_model"] = dumps({"text": "saved"})
    audit.on_node(TurnContext("v", 1), node, {}, {"text": "new"}, {})  # type: ignore[arg-type]
    assert audit.verdict("v", missed=False)["status"] == "diverged"
    # After the first divergence nothing is compared, and what the provider kept for the task is dropped.
    given["v", "", None, 2, "03_call_model"] = b"kept"
    audit.on_node(TurnContext("v", 2), node, {}, {"text": "new"}, {})  # type: ignore[arg-type]
    assert not given


def test_the_audit_compares_what_a_record_would_hold_masked_and_with_blobs(tmp_path: Path) -> None:
    """The plain bytes are compared first; a saved record that was masked or had media moved to a blob still
    compares equal to the same output, and a secret or a picture that differs still diverges."""
    layout = RunLayout(tmp_path)
    redactor = Redactor(["sk-this-is-a-long-secret"], environ={})
    records = BlobStore(tmp_path, None)

    def record(value: dict[str, object]) -> bytes:  # what the recorder writes for a node's output
        return records.serialize(value, redactor.dumps)

    image = {"type": "image", "media_type": "image/png", "data": base64.b64encode(b"\x89PNG pixels").decode()}
    other = {**image, "data": base64.b64encode(b"\x89PNG other").decode()}
    node = SimpleNamespace(index=2, name="dispatch_tools", folder="02_dispatch_tools")
    cases: dict[str, dict[str, object]] = {
        "secret": {"text": "key sk-this-is-a-long-secret", "api_key": "v"},
        "media": {"content": [image]},
        "plain": {"text": "nothing to mask"},
    }
    for task, output in cases.items():
        path = Path(TurnDirs(layout).node_file(task, 1, 2, "dispatch_tools", OUTPUT_FILE))
        path.parent.mkdir(parents=True)
        path.write_bytes(record(output))
    audit = ReplayAudit(layout, redactor.dumps)
    for task, output in cases.items():
        audit.on_node(TurnContext(task, 1), node, {}, output, {})  # type: ignore[arg-type]
        assert audit.verdict(task, missed=False) == {"status": "exact"}, task
    # The same files against other outputs: another secret, another picture.
    changed: dict[str, dict[str, object]] = {
        "secret": {"text": "key sk-another-long-secret!", "api_key": "v"},
        "media": {"content": [other]},
    }
    for task, output in changed.items():
        audit.forget(task)
        audit.on_node(TurnContext(task, 1), node, {}, output, {})  # type: ignore[arg-type]
        assert audit.verdict(task, missed=False)["status"] == "diverged", task


def test_the_audit_trusts_the_saved_digests_and_reads_a_file_only_where_they_do_not_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the saved run's digests.json, an output that has its node's digest (plain, or as it was recorded:
    masked) is exact without a read; one that does not is compared with the file, which decides."""
    layout = RunLayout(tmp_path)
    redactor = Redactor(["sk-this-is-a-long-secret"], environ={})
    node = SimpleNamespace(index=5, name="parse_tool_calls", folder="05_parse_tool_calls")
    outputs: dict[str, dict[str, object]] = {
        "plain": {"tool_calls": []},
        "masked": {"text": "key sk-this-is-a-long-secret"},
        "changed": {"tool_calls": []},
        "stale": {"tool_calls": []},  # its digest was not updated when its file was: the file decides
    }
    for task, output in outputs.items():
        path = Path(TurnDirs(layout).node_file(task, 1, 5, "parse_tool_calls", OUTPUT_FILE))
        path.parent.mkdir(parents=True)
        path.write_bytes(redactor.dumps(output))
        recorded = redactor.dumps({"tool_calls": ["old"]}) if task == "stale" else path.read_bytes()
        found = Digests({node_key(1, node.folder): digest(recorded)})
        (layout.records(task) / DIGESTS_FILE).write_bytes(found.to_bytes())
    reads: list[str] = []

    def counted(path: str) -> bytes:
        reads.append(path)
        return read_saved(path)

    monkeypatch.setattr("flowllm.run.replay_audit.read_saved", counted)
    audit = ReplayAudit(layout, redactor.dumps)
    produced = {**outputs, "changed": {"tool_calls": [{"name": "other"}]}}
    verdicts = {}
    for task, output in produced.items():
        audit.on_node(TurnContext(task, 1), node, {}, output, {})  # type: ignore[arg-type]
        verdicts[task] = audit.verdict(task, missed=False)["status"]
    assert verdicts == {"plain": "exact", "masked": "exact", "changed": "diverged", "stale": "exact"}
    assert sorted(Path(p).parts[-4] for p in reads) == ["changed", "stale"]
