"""``flowllm bundle`` and ``flowllm verify FILE`` from the outside: a sweep (one plain job, one of two epochs) and a
fork of its first job, run offline on a GAIA-format fixture whose answers are right by GAIA's rule without quoting
the ground truth; each bundled and checked by a verifier without the publisher's keys.

The sweep runs with canary secrets (a secret-named environment variable, the provider's key variable, a tool
server's literal token): none of them, and none of the ground-truth strings, may be found in the archive.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import orjson
import pytest

from flowllm.bundle.archive import GZIP, read_bundle, write_bundle
from flowllm.bundle.cli import bundle_main, verify_main
from flowllm.bundle.manifest import MANIFEST_FILE, MANIFEST_HASH_FILE, sha256
from flowllm.exit_codes import ExitCode
from flowllm.run.report import format_usd
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import RunSummary
from tests.experiment.helpers import run_flowllm

# What this calls in process may start `python -m flowllm` (a bundle's replay, a bisect's forks): forked.
pytestmark = pytest.mark.usefixtures("forked_python")

DATA = Path(__file__).resolve().parent / "data" / "gaialike"
TASK_IDS = ("bundle-01-abbey", "bundle-02-number", "bundle-03-town")
CANARIES = {
    "FLOWLLM_BUNDLE_TEST_API_KEY": "canary-env-7f3a9c1e",  # named like a secret: masked wherever it shows
    "BUNDLE_CANARY_KEYVAR": "canary-key-2b8d4e6f",  # provider.api_key_env names it
}
TOOL_TOKEN = "canary-literal-9e2f4a6b"  # a literal in the config: a tool server's env entry
OVERRIDES = (
    "progress=false",
    f"dataset.path={DATA}",
    "~tools.servers.tool-files",
    "~tools.servers.tool-math",
    f"+tools.servers.tool-python.env.CANARY_TOKEN={TOOL_TOKEN}",
)

REPRODUCED = re.compile(r"reproduced: (\S+)% ± (\S+) \[(\S+), (\S+)\] n=(\d+), (\d+)/(\d+) tasks replayed exactly")


def ground_truths() -> list[str]:
    rows = [orjson.loads(line) for line in (DATA / "metadata.jsonl").read_bytes().splitlines() if line.strip()]
    return [str(row["Final answer"]) for row in rows]


def bundle(source: Path, out: Path, *extra: str) -> Path:
    """``flowllm bundle`` as the publisher runs it: with the canary secrets in the environment."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CANARIES.items():
            patch.setenv(name, value)
        assert bundle_main([str(source), "-o", str(out), *extra]) == ExitCode.OK
    return out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sweep") / "sweep"
    done = run_flowllm(
        "-m",
        *OVERRIDES,
        f"provider.emulator_script={DATA / 'script.yaml'}",
        "provider.api_key_env=BUNDLE_CANARY_KEYVAR",
        "experiment.epochs=1,2",
        f"hydra.sweep.dir={folder}",
        env=CANARIES,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


@pytest.fixture(scope="module")
def sweep_bundle(sweep: Path) -> Path:
    return bundle(sweep, sweep.parent / "sweep.tar.zst")


@pytest.fixture(scope="module")
def fork_bundle(sweep: Path) -> Path:
    """A fork of the sweep's first job: live from turn 2 with another emulator script."""
    fork = sweep.parent / "fork"
    done = run_flowllm(
        *OVERRIDES,
        "provider=replay",
        f"provider.run_dir={sweep / '0'}",
        "provider.fork=live",
        "provider.live=offline",
        "provider.fork_at_turn=2",
        f"hydra.run.dir={fork}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return bundle(fork, sweep.parent / "fork.tar.zst")


def headline(run: Path) -> str:
    """The accuracy figures of a run's own summary, as verify prints them."""
    acc = RunSummary.from_dict(orjson.loads(RunLayout(run).summary.read_bytes())).stats.accuracy  # type: ignore[union-attr]
    low, high = acc["ci95"]
    return f"{100 * acc['mean']:.1f}% ± {100 * acc['stderr']:.1f} [{100 * low:.1f}, {100 * high:.1f}] n={acc['n']}"


def test_each_job_of_a_sweep_bundle_reproduces(
    sweep: Path, sweep_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert verify_main([str(sweep_bundle)]) == ExitCode.OK  # no canary in this process's environment
    lines = [line for line in capsys.readouterr().out.splitlines() if "reproduced:" in line]
    assert [line.split("]:")[0].rsplit("[", 1)[1] for line in lines] == ["0", "1"]  # the plain job, the epochs one
    for job, line in zip(("0", "1"), lines, strict=True):
        assert f"reproduced: {headline(sweep / job)}, 3/3 tasks replayed exactly" in line
        cost = RunSummary.from_dict(orjson.loads(RunLayout(sweep / job).summary.read_bytes())).cost_usd
        assert cost is not None and line.endswith(f", cost {format_usd(cost)}")  # the run's figure, not rounded
    assert list(tmp_path.iterdir()) == []  # verify wrote nothing where it ran


def test_a_fork_bundle_reproduces_against_its_answer_hashes(
    fork_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Verified against the dataset without its answers (GAIA's hidden "?"), let through with
    --dataset-changed-ok: every answer is scored by the hash the bundle records."""
    dataset = tmp_path / "dataset"
    shutil.copytree(DATA, dataset)
    rows = (DATA / "metadata.jsonl").read_text()
    for answer in ground_truths():
        rows = rows.replace(f'"Final answer": "{answer}"', '"Final answer": "?"')
    (dataset / "metadata.jsonl").write_text(rows)
    assert verify_main([str(fork_bundle), "--dataset", str(dataset), "--dataset-changed-ok"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert REPRODUCED.search(out) and "3/3 tasks replayed exactly" in out, out
    assert "note: the dataset" in out and "first metadata.jsonl" in out
    assert "3 task(s) scored by the bundle's answer hashes" in out


def test_a_fork_bundle_reproduces_where_the_run_it_forked_is_not(
    sweep: Path, fork_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A third party has the bundle, not the publisher's folders. The fork's replies are its own records, but which
    protocol reads them was found by following the fork to the run it forked: the bundle verified only on the
    machine that made it ("NOT reproduced: ... has no .hydra/config.yaml" anywhere else)."""
    away = sweep.parent / "elsewhere"
    (sweep / "0").rename(away)
    try:
        assert verify_main([str(fork_bundle)]) == ExitCode.OK
    finally:
        away.rename(sweep / "0")
    out = capsys.readouterr().out
    assert REPRODUCED.search(out) and "3/3 tasks replayed exactly" in out, out


def unpacked(bundle_file: Path, dest: Path) -> dict[str, bytes]:
    read_bundle(bundle_file, dest)
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}


def test_the_bundle_holds_no_ground_truth_and_no_secret(sweep: Path, sweep_bundle: Path, tmp_path: Path) -> None:
    files = unpacked(sweep_bundle, tmp_path / "plain")
    everything = b"\n".join(files.values()).lower()
    for text in [*ground_truths(), *CANARIES.values(), TOOL_TOKEN]:
        assert text.lower().encode() not in everything, text
    manifest = orjson.loads(files[MANIFEST_FILE])
    assert manifest["with_answers"] is False
    assert [sorted(job["ground_truth"]) for job in manifest["jobs"]] == [list(TASK_IDS)] * 2
    assert not any(name.startswith("runs/0/tasks/") and "/workspace/" in name for name in files)
    kept = unpacked(bundle(sweep / "0", tmp_path / "answers.tar.zst", "--with-answers"), tmp_path / "answers")
    assert b"Quillomarca" in kept["runs/run/tasks/bundle-03-town/result.json"]


# A saved reply, an answer and a ledger line of the fork's bundle, each changed.
EDITS = {
    "reply": ("tasks/bundle-03-town/turn_001/03_call_model/output.json", "Lima", "Quito"),
    "answer": ("tasks/bundle-01-abbey/result.json", '"answer": "Zephyrine Quarvelle-Abbey"', '"answer": "Ely"'),
    "ledger": ("usage.jsonl", '"output_tokens":11', '"output_tokens":99'),
}


def repacked(bundle_file: Path, tmp_path: Path, edits: list[str], *, rewrite_manifest: bool = False) -> Path:
    """The bundle with the ``edits`` made, packed again (gzip); with ``rewrite_manifest`` its manifest is made to
    agree with them, as a forger would."""
    files = unpacked(bundle_file, tmp_path / "edit")
    for edit in edits:
        name, old, new = EDITS[edit]
        name = f"runs/run/{name}"
        assert old.encode() in files[name], (name, old)
        files[name] = files[name].replace(old.encode(), new.encode())
        if rewrite_manifest:
            manifest = orjson.loads(files[MANIFEST_FILE])
            manifest["files"][name] = sha256(files[name])
            files[MANIFEST_FILE] = orjson.dumps(manifest, option=orjson.OPT_INDENT_2)
            files[MANIFEST_HASH_FILE] = (sha256(files[MANIFEST_FILE]) + "\n").encode()
    out = tmp_path / "edited.tar.gz"
    write_bundle(out, files.items(), GZIP)
    return out


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_file_is_named_by_the_manifest_check(
    edit: str, fork_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited = repacked(fork_bundle, tmp_path, [edit])
    assert verify_main([str(edited)]) == ExitCode.UNVERIFIED
    out = capsys.readouterr().out
    assert f"NOT reproduced: the bundle does not match its manifest (first: runs/run/{EDITS[edit][0]}:" in out


def test_edits_behind_a_rewritten_manifest_are_found_by_the_replay_and_the_audit(
    fork_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited = repacked(fork_bundle, tmp_path, list(EDITS), rewrite_manifest=True)
    assert verify_main([str(edited)]) == ExitCode.UNVERIFIED
    out = capsys.readouterr().out
    assert "task bundle-03-town: diverged at turn 1" in out
    assert "runs/run/tasks/bundle-03-town/turn_001/" in out  # the saved node that did not reproduce
    assert "runs/run/tasks/bundle-01-abbey/result.json says answer 'Ely', the replay gives 'Zephyrine" in out
    assert "runs/run/usage.jsonl: line 1" in out
    assert "bundle-02-number" not in out  # the task nobody edited reproduced


def bad_inputs(fork_bundle: Path, folder: Path) -> dict[str, Path]:
    not_bundle = folder / "notes.tar.zst"
    not_bundle.write_text("not an archive\n")
    truncated = folder / "truncated.tar.zst"
    data = fork_bundle.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    files = unpacked(fork_bundle, folder / "newer")
    manifest = orjson.loads(files[MANIFEST_FILE])
    manifest["format_version"] = 99
    files[MANIFEST_FILE] = orjson.dumps(manifest)
    files[MANIFEST_HASH_FILE] = (sha256(files[MANIFEST_FILE]) + "\n").encode()
    newer = folder / "newer.tar.gz"
    write_bundle(newer, files.items(), GZIP)
    return {"not a flowllm bundle": not_bundle, "truncated": truncated, "newer than this flowllm": newer}


def test_bad_input_is_one_line_exit_2_and_leaves_nothing(
    fork_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = bad_inputs(fork_bundle, tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    monkeypatch.chdir(scratch)
    changed = tmp_path / "changed"
    shutil.copytree(DATA, changed)
    rows = (DATA / "metadata.jsonl").read_bytes()
    (changed / "metadata.jsonl").write_bytes(rows.replace(b"Quillomarca", b"Quillomarka"))
    assert verify_main([str(fork_bundle), "--dataset", str(changed)]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "differs from the one the run read (1 file(s), first metadata.jsonl)" in err
    for said, path in inputs.items():
        assert verify_main([str(path)]) == ExitCode.CONFIG, said
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    assert list(scratch.iterdir()) == []  # the temporary folders are gone, nothing else was written


def test_a_bundle_of_a_replay_whose_tasks_diverged_reproduces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay with another stage (repair=strict) leaves the tasks that diverged from the saved run unscored. The
    check replays the bundled replay against its own records, where those tasks replay exactly: it scored them and
    called the bundle "NOT reproduced" ("says correct None, the replay gives True", an interval over more tasks).
    Their verdict is the bundled run's own, against the run it replayed; every other number is checked as ever."""
    saved, replay = tmp_path / "saved", tmp_path / "replay"
    assert run_flowllm("progress=false", f"hydra.run.dir={saved}").returncode == 0
    strict = run_flowllm(
        "progress=false", "provider=replay", f"provider.run_dir={saved}", "repair=strict", f"hydra.run.dir={replay}"
    )
    assert strict.returncode == 0, strict.stderr[-2000:]
    block = RunSummary.from_dict(orjson.loads(RunLayout(replay).summary.read_bytes())).replay
    assert block is not None and block.diverged, "no task diverged: the test proves nothing"
    for answers in ((), ("--with-answers",)):
        bundle_file = bundle(replay, tmp_path / f"replay{len(answers)}.tar.zst", *answers)
        assert verify_main([str(bundle_file)]) == ExitCode.OK, capsys.readouterr().out
        out = capsys.readouterr().out
        assert f"reproduced: {headline(replay)}" in out, out
