"""``experiment.store=s3://...``: runs kept on a real S3 server (SeaweedFS, started here), read back from its URL.

The offline sample runs with a store while a reader polls the store and parses every ``result.json`` it sees;
``inspect``, the report, ``verify``, exports, the analysis tables, replay and ``merge`` take the store's URL; a
run SIGKILLed mid-task is resumed from the store alone, into a fresh local folder (another machine); an
unreachable store is refused before anything runs; the credentials reach the store and never the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flowllm.analysis.frames import load as load_frames
from flowllm.bundle.cli import bundle_main
from flowllm.bundle.cli import verify_main as bundle_verify
from flowllm.cli.merge import main as merge_main
from flowllm.errors import CliError
from flowllm.inspect.cli import main as inspect_main
from flowllm.rundir.results import RunSummary, TaskResult
from flowllm.rundir.store import local_run
from flowllm.verify.cli import main as verify_main
from tests.appfork import run_app
from tests.experiment.helpers import ROOT, run_flowllm
from tests.experiment.s3_server import BUCKET, KEY_ID, SECRET, S3Server
from tests.experiment.test_resume_in_task import TASKS, Session, Sessions, held_call, kill_when, results, resumed_turns

# What this calls in process may start `python -m flowllm` (a bundle's replay, a bisect's forks): forked.
pytestmark = [pytest.mark.long, pytest.mark.usefixtures("forked_python")]


SAMPLE_TASKS = 4  # the sample's first four: two in each shard
SHARDS = 2


def answers(run: Path) -> dict[str, tuple[Any, ...]]:
    found = {}
    for path in (run / "tasks").glob("*/result.json"):
        result = json.loads(path.read_bytes())
        found[path.parent.name] = (result["status"], result["answer"], result.get("correct"))
    return found


def store_env(s3: S3Server, cache: Path) -> dict[str, str]:
    return {**s3.env(), "FLOWLLM_STORE_CACHE": str(cache)}


def flowllm(s3: S3Server, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_flowllm(*args, env=store_env(s3, cache), timeout=300)


@dataclass
class Poller:
    """Reads every result.json under the store's runs, again and again, while the runs write there."""

    s3: S3Server
    prefix: str
    seen: dict[str, int] = field(default_factory=dict)  # key -> how many times it was read and parsed
    stop: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> None:
        fs = self.s3.fs()
        for key in fs.find(self.prefix):
            if key.endswith("/result.json"):
                body = fs.cat_file(key)  # a half-written object would not parse
                TaskResult.from_dict(json.loads(body))
                self.seen[key] = self.seen.get(key, 0) + 1

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            time.sleep(0.2)


@dataclass
class StoredRun:
    """The sample's shards, each kept under its own prefix of the store, and their local scratch folders."""

    urls: list[str]
    locals: list[Path]
    cache: Path
    poller: Poller


@pytest.fixture(scope="module")
def stored(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> StoredRun:
    """The offline sample (four tasks) run as two shards at once, each with experiment.store on the S3 server,
    while a reader polls the store."""
    root = tmp_path_factory.mktemp("stored")
    urls = [f"s3://{BUCKET}/runs/shard{i}" for i in range(SHARDS)]
    folders = [root / f"shard{i}" for i in range(SHARDS)]
    poller = Poller(s3, f"{BUCKET}/runs")
    thread = threading.Thread(target=poller.run, daemon=True)
    thread.start()
    try:
        env = {**os.environ, **store_env(s3, root / "cache")}
        shards = [
            [
                "progress=false",
                f"dataset.limit={SAMPLE_TASKS}",
                f"experiment.shard={i}/{SHARDS}",
                f"experiment.store={url}",
                f"hydra.run.dir={folder}",
            ]
            for i, (url, folder) in enumerate(zip(urls, folders, strict=True))
        ]
        with ThreadPoolExecutor(SHARDS) as pool:  # the shards run at once, as on separate machines
            for done in pool.map(lambda args: run_app(args, cwd=ROOT, env=env, timeout=300), shards):
                assert done.returncode == 0, done.stderr[-3000:]
    finally:
        poller.stop.set()
        thread.join()
    poller.poll()  # and once after the runs
    return StoredRun(urls, folders, root / "cache", poller)


@pytest.fixture
def store_reader(s3: S3Server, stored: StoredRun, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process reads the store as a user's shell would: the standard variables, the cache folder."""
    for name, value in store_env(s3, stored.cache).items():
        monkeypatch.setenv(name, value)


def test_the_store_holds_the_runs_and_never_a_partial_result(stored: StoredRun, s3: S3Server) -> None:
    fs = s3.fs()
    results_seen = 0
    for url, local in zip(stored.urls, stored.locals, strict=True):
        prefix = url.removeprefix("s3://")
        keys = {key[len(prefix) + 1 :] for key in fs.find(prefix)}
        assert {"summary.json", "usage.jsonl", "fingerprint.json", ".hydra/config.yaml", "history.jsonl"} <= keys
        assert {k for k in keys if k.endswith("/result.json")} == {
            p.relative_to(local).as_posix() for p in (local / "tasks").rglob("result.json")
        }
        assert not any("/workspace/" in k or k.endswith(".tmp") for k in keys)  # scratch stays local
        for rel in ("summary.json", "usage.jsonl"):  # the local records, byte for byte
            assert fs.cat_file(f"{prefix}/{rel}") == (local / rel).read_bytes()
        results_seen += len([k for k in keys if k.endswith("/result.json")])
    assert results_seen == SAMPLE_TASKS
    # the poller parsed every result.json it read (a partial one would have raised in the fixture)
    assert len(stored.poller.seen) == SAMPLE_TASKS


def test_credentials_are_never_written(stored: StoredRun, s3: S3Server) -> None:
    fs = s3.fs()
    blobs = [path.read_bytes() for local in stored.locals for path in local.rglob("*") if path.is_file()]
    blobs += list(fs.cat(fs.find(f"{BUCKET}/runs")).values())
    for secret in (KEY_ID, SECRET):
        assert not any(secret.encode() in blob for blob in blobs), secret


@pytest.mark.usefixtures("store_reader")
def test_readers_take_the_store_url(stored: StoredRun, s3: S3Server, tmp_path: Path, capsys: Any) -> None:
    url, local = stored.urls[0], stored.locals[0]
    assert inspect_main([url]) == 0
    assert "all 2 tasks completed" in capsys.readouterr().out
    report = tmp_path / "report.html"
    assert inspect_main(["report", url, "-o", str(report)]) == 0 and report.stat().st_size > 10_000
    assert verify_main([url]) == 0 and "verified" in capsys.readouterr().out
    bundle = tmp_path / "run.tar.zst"  # published from the store, reproduced offline from the bundle
    assert bundle_main([url, "-o", str(bundle)]) == 0
    assert bundle_verify([str(bundle)]) == 0 and "reproduced" in capsys.readouterr().out
    submission = tmp_path / "submission.jsonl"
    assert inspect_main(["export", url, "--format", "gaia-submission", "-o", str(submission)]) == 0
    lines = [json.loads(line) for line in submission.read_text().splitlines()]
    assert len([line for line in lines if line["model_answer"]]) == 2  # the shard's two answers (all tasks listed)
    assert len(load_frames(url).tasks) == 2  # the notebooks' tables
    # the sample's shards merged from their URLs: every task once, and the merge verifies
    merged = tmp_path / "merged"
    assert merge_main([*stored.urls, "-o", str(merged)]) == 0
    assert f"{SAMPLE_TASKS} tasks, {SAMPLE_TASKS} completed" in capsys.readouterr().out
    assert verify_main([str(merged)]) == 0
    # replay a stored run into a local folder: the same answers, and this run has no store of its own
    replay = tmp_path / "replay"
    replay_args = ("progress=false", "provider=replay", f"provider.run_dir={url}", f"hydra.run.dir={replay}")
    replayed = flowllm(s3, stored.cache, *replay_args)
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert answers(replay) == answers(local)
    assert "store: null" in (replay / ".hydra" / "config.yaml").read_text()


def test_an_unreachable_store_is_refused_before_anything_runs(tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/runs/nowhere"
    env = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    done = run_flowllm("progress=false", f"experiment.store={url}", f"hydra.run.dir={tmp_path / 'run'}", env=env)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("flowllm: error:")]
    assert len(errors) == 1 and url in errors[0], done.stderr
    assert not (tmp_path / "run" / "tasks").exists()


@dataclass
class StoreSession(Session):
    """A resume test session whose run is kept in the store (``extra`` names it) and reaches the S3 server."""

    s3_env: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, **self.s3_env}


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    made = Sessions(tmp_path_factory.mktemp("resume"))
    yield made
    for emulator in made.emulators:
        emulator.stop(timeout_s=2)


def in_store(fs: Any, prefix: str, task: str, turn: int) -> bool:
    return bool(fs.glob(f"{prefix}/tasks/{task}/turn_{turn:03d}/*_call_model/output.json"))


def kill_once_stored(s: StoreSession, fs: Any, prefix: str) -> None:
    """Run until resume-c has finished and resume-a and resume-b hold mid-task with their turn-2 replies in the
    store (resume-a in its gated tool, resume-b's turn-3 call held by the emulator), then SIGKILL the run."""

    def held() -> bool:
        fs.invalidate_cache()  # what the store holds now, not a listing cached by the last look
        return (
            (s.gate / "resume-a.held").exists()
            and s.emulator._app.attempts[("resume-b", "main", 3)] >= 1
            and fs.exists(f"{prefix}/tasks/resume-c/result.json")
            and in_store(fs, prefix, "resume-a", 2)
            and in_store(fs, prefix, "resume-b", 2)
        )

    kill_when(s, held, poll_s=0.1)


def test_a_killed_run_resumes_from_the_store_on_another_machine(
    sessions: Sessions, s3: S3Server, tmp_path: Path
) -> None:
    url, prefix = f"s3://{BUCKET}/runs/killed", f"{BUCKET}/runs/killed"
    base = sessions("killed", f"experiment.store={url}", faults=held_call(1))
    killed = StoreSession(base.run_dir, base.emulator, base.gate, base.extra, s3_env=store_env(s3, tmp_path))
    fs = s3.fs()
    kill_once_stored(killed, fs, prefix)
    assert not fs.exists(f"{prefix}/tasks/resume-a/result.json")
    # the rerun starts from an empty local folder: all it knows of the killed run is in the store
    elsewhere = StoreSession(tmp_path / "elsewhere", base.emulator, base.gate, base.extra, s3_env=killed.s3_env)
    elsewhere.run()
    assert {r["task_id"]: (r["status"], r["correct"]) for r in results(elsewhere.run_dir).values()} == {
        task: ("completed", True) for task in TASKS
    }
    assert set(killed.answered().values()) == {1}  # no turn sent twice (the held one was never answered)
    assert {t: resumed_turns(elsewhere.run_dir, t) for t in TASKS} == {"resume-a": 2, "resume-b": 2, "resume-c": 0}
    summary = RunSummary.from_dict(json.loads(fs.cat_file(f"{prefix}/summary.json")))
    assert summary.resumed == 1 and summary.completed == summary.correct == 3
    assert not s3.fs().find(f"{prefix}/.resume")  # the moved-aside turns are gone from the store too (a fresh listing)
    verified = flowllm(s3, tmp_path / "cache", "verify", url)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_run_read_again_in_one_process_shows_what_the_store_holds_now(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook or a long-lived reader reads a run that is still being written, another run, then the first
    again: the last read has the objects written since (fsspec caches listings per process; a stale one failed
    with FileNotFoundError)."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    fs, growing, other = s3.fs(), f"{BUCKET}/runs/growing", f"{BUCKET}/runs/other"
    fs.pipe_file(f"{growing}/tasks/a/result.json", b"{}")
    fs.pipe_file(f"{other}/tasks/a/result.json", b"{}")
    local_run(f"s3://{growing}", cache=tmp_path)
    local_run(f"s3://{other}", cache=tmp_path)
    fs.pipe_file(f"{growing}/tasks/a/turn_001/output.json", b"{}")
    fs.pipe_file(f"{growing}/tasks/a/timing.json", b"{}")
    run = local_run(f"s3://{growing}", cache=tmp_path)
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*.json")) == [
        "tasks/a/result.json",
        "tasks/a/timing.json",
        "tasks/a/turn_001/output.json",
    ]


def test_a_store_read_before_its_credentials_were_set_is_read_once_they_are(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first read without credentials fails with one line; once they are set, the same URL reads (each open
    gets a client of its own: fsspec's per-process cache kept the first, credential-less one, and every later
    reader in the process failed)."""
    fs, url = s3.fs(), f"s3://{BUCKET}/runs/credentials"
    fs.pipe_file(f"{url}/tasks/a/result.json", b"{}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    with pytest.raises(CliError, match=f"cannot read the run at {url}: .*credentials"):
        local_run(url, cache=tmp_path / "cache")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    run = local_run(url, cache=tmp_path / "cache")
    assert (run / "tasks/a/result.json").read_bytes() == b"{}"
