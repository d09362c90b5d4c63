"""The composition matrix: features combined as researchers combine them, and every run must pass ``flowllm verify``.

Each feature works alone and is tested alone elsewhere; wrong numbers came from combinations (a fork's statistics,
a budget across epochs, batch results across epochs, a refused resume). The rows below are a covering array of
all pairs of the factors' levels (computed once with allpairspy and written down as data; each column added since
was chosen to cover every pair with the others; ``test_the_rows_cover_every_pair`` keeps them so). Each row makes
a run of the matrix dataset (``data/matrix``: three sample tasks, a sub-agent task, GAIA's hidden answer "?", an
empty and a missing answer, a wrong answer), as one process or as two shards put together by ``flowllm merge``,
alone or keeping its spend and rate limits in a real Redis server, scored by GAIA's rules or by an LLM judge, its
history compacted or not, then what ``then`` says: nothing, an exact replay, a fork on a changed stage
(repair=strict), a fork at turn 2, or a resume after SIGINT or SIGKILL. Every run folder it leaves must verify, and
so must its Inspect AI log (``flowllm verify RUN --export``: scores, answers and model usage against the run).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import astuple, dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest

from flowllm.bundle.make import make_bundle
from flowllm.exit_codes import ExitCode
from flowllm.export.inspect_log import write_eval_log
from flowllm.export.source import open_source
from flowllm.rundir.results import LedgerLine, TaskResult
from flowllm.rundir.store import local_run
from flowllm.verify import audit_run
from tests.appfork import start_app
from tests.experiment.helpers import ROOT, run_flowllm
from tests.experiment.s3_server import BUCKET, S3Server

pytestmark = pytest.mark.long

MATRIX = Path(__file__).resolve().parent / "data" / "matrix"
OK_EXITS = (0, 3)  # every task finished (right, wrong or unscored), or the budget stopped the run
# A fork of a run its budget stopped fails the tasks the saved run never finished (no reply to serve): every task
# of it may fail (4); its numbers must still verify.
FOLLOW_UP_EXITS = (0, 3, 4)
# Faults of the first run, each retried at once: every task's first call is answered empty (read, refused: the
# provider billed it, so must the ledger; a task that starts meets it, whatever a tight budget stops), and some
# later first attempts meet an overloaded server.
FAULTS = [
    "+provider.emulator_faults={seed: 3, rules: [{fault: empty, turns: [1], attempts: [1]},"
    " {fault: status, status: 529, rate: 0.3, attempts: [1]}]}",
    "provider.retry.base_delay_s=0.01",
]
# The judged rows' scorer: BrowseComp's grader on the judge's own loopback emulator (an answer judged wrong, one
# given no verdict: a scoring error, unscored).
MATRIX_JUDGE = Path(__file__).resolve().parent / "data" / "matrix_judge.yaml"
JUDGED = [
    "dataset.scorer=judge",
    "judge.provider=offline",
    "judge.template=browsecomp",
    f"judge.emulator_script={MATRIX_JUDGE}",
]
JUDGED_NOT_CHECKED = ["verdicts of the judge scorer are taken as recorded (a model judged them)"]
COMPACTING = [
    "agent.compaction.enabled=true",
    "agent.compaction.threshold_tokens=200",
    "agent.compaction.keep_turns=1",
]
SHARDS = 2
FIRST_RESULT_WAIT_S = 120  # how long an interrupted row waits for a first task to finish before it interrupts


@dataclass(frozen=True)
class Row:
    then: str  # none | replay | fork | fork_at_turn | sigint | sigkill
    runner: str
    wire: str  # the offline provider of one wire protocol
    workers: int
    epochs: int
    attempts: int
    budget: str  # none | tight (stops the run partway)
    limits: str  # none | turns (agent.limits.turns=2)
    batch: str  # off | on (provider.batch.enabled)
    telemetry: str  # off | on (telemetry.otlp_endpoint, a loopback receiver)
    subagent: str  # off | on (+subagents=analyst)
    store: str  # off | on (experiment.store on a real S3 server; a replay or fork reads the run from the store)
    # off | on: the first run's emulator answers first calls empty and some first attempts with a 529 (FAULTS). Its
    # batch endpoint injects no fault: with batch on, the faults are set and meet no call.
    faults: str
    # off | on: the first run is two processes of experiment.shard=I/2 (each its own folder, or its own store URL),
    # put together by ``flowllm merge``; what ``then`` says is done to the merged run.
    shard: str
    scorer: str  # rules (GAIA's) | judge (an LLM judge on its own loopback emulator, MATRIX_JUDGE's verdicts)
    # off | redis: the first run (each of its shards, each of its workers) keeps its spend and rate limits in a
    # real Redis server (experiment.coordination), one key per row: its shards share one budget.
    coordination: str
    # off | on: history compaction (agent.compaction, a summary call of its own once a conversation passes 200
    # tokens, the latest turn kept): what a replay, a fork and a resume must serve from the node that holds it.
    compaction: str

    @classmethod
    def parse(cls, line: str) -> Row:
        """A row of the table below: its values in field order, the counts as numbers."""
        values: list[str | int] = [int(v) if v.isdigit() else v for v in line.split()]
        return cls(*values)  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        return "-".join(str(v) for v in astuple(self))

    def store_url(self, step: str) -> str | None:
        """Where the run of ``step`` (base, or what ``then`` made) is kept when the row keeps runs in a store."""
        return f"s3://{BUCKET}/matrix/{self.name}/{step}" if self.store == "on" else None

    def overrides(self, otlp: str, step: str = "base") -> list[str]:
        found = [
            "progress=false",
            f"dataset.path={MATRIX}",
            f"runner={self.runner}",
            f"experiment.workers={self.workers}",
            f"experiment.epochs={self.epochs}",
            f"experiment.attempts={self.attempts}",
        ]
        found += ["experiment.budget.cost_usd=0.01"] if self.budget == "tight" else []
        found += ["agent.limits.turns=2"] if self.limits == "turns" else []
        found += [f"telemetry.otlp_endpoint={otlp}"] if self.telemetry == "on" else []
        found += ["+subagents=analyst"] if self.subagent == "on" else []
        found += JUDGED if self.scorer == "judge" else []
        found += COMPACTING if self.compaction == "on" else []
        url = self.store_url(step)
        return found + ([f"experiment.store={url}"] if url else [])

    def live(self) -> list[str]:
        """The provider of the first run (the one a replay or a fork reads)."""
        found = [f"provider={self.wire}", f"provider.emulator_script={MATRIX / 'script.yaml'}"]
        # A batch goes out 0.3 s after its first call and is polled every 0.05 s (5 s by default: minutes a row).
        batched = ["provider.batch.enabled=true", "provider.batch.max_wait_s=0.3", "provider.batch.poll_s=0.05"]
        found += batched if self.batch == "on" else []
        return found + (FAULTS if self.faults == "on" else [])

    def follow_up(self, base: Path) -> list[str]:
        # A merged run is a local folder (its shards are what the store holds).
        saved = base if self.shard == "on" else (self.store_url("base") or base)
        replay = ["provider=replay", f"provider.run_dir={saved}"]
        if self.then == "fork":
            return [*replay, "provider.fork=live", f"provider.live={self.wire}", "repair=strict"]
        if self.then == "fork_at_turn":
            return [*replay, "provider.fork=live", f"provider.live={self.wire}", "provider.fork_at_turn=2"]
        return replay


# All pairs of the factors' levels (allpairspy 2.5, the factors in Row's order; the store, faults and compaction
# columns were added later, their levels chosen so that every pair with them is covered too; compaction is on where
# no turn limit keeps a task from its third turn, the first it can compact).
# One row per line, the values in Row's field order: then, runner, wire, workers, epochs, attempts, budget,
# limits, batch, telemetry, subagent, store, faults, shard, scorer, coordination, compaction.
TABLE = """
none         legacy         offline           1 1 1 none none off off off off on on judge redis on
replay       graph          offline_chat      2 3 2 tight turns on on off off off on judge off off
fork         graph_parallel offline_responses 2 1 2 none turns off on on off off on judge off off
fork_at_turn graph_parallel offline_chat      1 3 1 tight none on off on off off on judge off on
sigint       graph          offline           1 1 2 tight none off on on off on on rules redis off
sigkill      legacy         offline_responses 2 3 1 tight turns on off on on off on judge off off
sigkill      graph          offline           2 3 1 none none off on off off off off rules off on
sigint       legacy         offline_chat      2 1 2 none turns on off off on off off judge off off
fork_at_turn graph          offline_responses 1 1 2 none turns off off off on off off rules redis off
fork         legacy         offline           1 3 1 tight turns on off off on on off rules redis off
replay       graph_parallel offline           1 1 1 none none off off off on off off rules redis on
none         graph          offline_responses 2 3 2 tight turns on on on on off off rules off on
sigkill      graph_parallel offline_chat      1 1 2 tight turns off off off off on off rules redis off
fork_at_turn legacy         offline           2 1 2 tight turns off on off off on off rules off off
sigint       graph_parallel offline_responses 2 3 1 tight none off off off off off off rules off on
replay       legacy         offline_responses 2 1 2 tight turns off off on off on off rules off off
fork         graph          offline_chat      2 1 2 tight none off off off off off off rules off on
none         graph_parallel offline_chat      2 1 2 tight turns off off off off off off rules off off
"""
ROWS = [Row.parse(line) for line in TABLE.strip().splitlines()]
LEVELS = {
    "then": ["none", "replay", "fork", "fork_at_turn", "sigint", "sigkill"],
    "runner": ["legacy", "graph", "graph_parallel"],
    "wire": ["offline", "offline_chat", "offline_responses"],
    "workers": [1, 2],
    "epochs": [1, 3],
    "attempts": [1, 2],
    "budget": ["none", "tight"],
    "limits": ["none", "turns"],
    "batch": ["off", "on"],
    "telemetry": ["off", "on"],
    "subagent": ["off", "on"],
    "store": ["off", "on"],
    "faults": ["off", "on"],
    "shard": ["off", "on"],
    "scorer": ["rules", "judge"],
    "coordination": ["off", "redis"],
    "compaction": ["off", "on"],
}


# Pairs no run can have: experiment.coordination is refused beside workers (its error: run more shards instead).
IMPOSSIBLE = {("workers", "coordination", 2, "redis")}


def test_the_rows_cover_every_pair() -> None:
    names = [f.name for f in fields(Row)]
    assert list(LEVELS) == names
    seen = {
        (a, b, row[a], row[b])
        for row in (dict(zip(names, astuple(r), strict=True)) for r in ROWS)
        for a, b in itertools.combinations(names, 2)
    }
    missing = [
        (a, va, b, vb)
        for a, b in itertools.combinations(names, 2)
        for va in LEVELS[a]
        for vb in LEVELS[b]
        if (a, b, va, vb) not in seen and (a, b, va, vb) not in IMPOSSIBLE
    ]
    assert missing == []
    assert not IMPOSSIBLE & seen  # and no row asks for one


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that takes every export and counts it."""

    received = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).received += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def otlp() -> Iterator[tuple[str, type[_Receiver]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Receiver
    server.shutdown()


def run_ok(*args: str, exits: tuple[int, ...] = OK_EXITS) -> None:
    done = run_flowllm(*args)  # the store's credentials and endpoint come from the environment (see the test)
    assert done.returncode in exits, (done.returncode, done.stderr[-3000:])


def interrupted_then_resumed(args: list[str], run: Path, sig: signal.Signals, log: Path) -> None:
    """The run is interrupted once a first task has finished, then run again into the same folder."""
    with log.open("w") as handle:
        proc = start_app(list(args), cwd=ROOT, env=dict(os.environ), stdout=handle.fileno(), stderr=handle.fileno())
        deadline = time.monotonic() + FIRST_RESULT_WAIT_S
        while proc.poll() is None and time.monotonic() < deadline and not any(run.glob("tasks/*/result.json")):
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.wait(timeout=300)
    run_ok(*args)  # the resume


def assert_verified(row: Row, run: Path) -> None:
    """The run verifies, and so does its Inspect AI log (scores, answers and model usage against the run); only a
    judge's verdicts are taken as recorded."""
    log = run.parent / f"{run.name}.eval"
    write_eval_log(open_source(run), log)
    audit = audit_run(run, exports=[log])
    assert audit.verified, "\n".join([f"{run.name} is not verified:", *(f.line() for f in audit.findings)])
    assert audit.compared > 50, audit.compared
    assert audit.not_checked == (JUDGED_NOT_CHECKED if row.scorer == "judge" else []), audit.not_checked


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_combination_verifies(
    row: Row, tmp_path: Path, otlp: tuple[str, type[_Receiver]], request: pytest.FixtureRequest
) -> None:
    url, receiver = otlp
    redis = request.getfixturevalue("redis_url") if row.coordination == "redis" else None
    if row.store == "on":
        s3: S3Server = request.getfixturevalue("s3")
        with pytest.MonkeyPatch.context() as patch:
            for name, value in {**s3.env(), "FLOWLLM_STORE_CACHE": str(tmp_path / "cache")}.items():
                patch.setenv(name, value)  # the runs started below and the store reads here
            check_row(row, tmp_path, url, receiver, redis)
    else:
        check_row(row, tmp_path, url, receiver, redis)


def assert_stored(row: Row, step: str, run: Path) -> None:
    """The store's copy of a run holds the same results as its local folder, and verifies on its own."""
    url = row.store_url(step)
    if url is None:
        return
    copy = local_run(url)
    local = {p.relative_to(run): p.read_bytes() for p in run.glob("tasks/*/result.json")}
    assert {p.relative_to(copy): p.read_bytes() for p in copy.glob("tasks/*/result.json")} == local
    assert_verified(row, copy)


def first_run(row: Row, tmp_path: Path, url: str, step: str, extra: tuple[str, ...] = ()) -> Path:
    """The row's first run (or one shard of it) in ``tmp_path / step``, interrupted and resumed if the row says so;
    verified, and its store's copy too."""
    run = tmp_path / step
    args = [*row.overrides(url, step), *row.live(), *extra, f"hydra.run.dir={run}"]
    if row.then in ("sigint", "sigkill"):
        sig = signal.SIGINT if row.then == "sigint" else signal.SIGKILL
        interrupted_then_resumed(args, run, sig, tmp_path / f"{step}.interrupted.log")
    else:
        run_ok(*args)
    assert_verified(row, run)
    assert_stored(row, step, run)
    return run


def merged_shards(row: Row, tmp_path: Path, url: str, extra: tuple[str, ...]) -> Path:
    """The first run as shards, each verified, merged from their folders (or their store URLs) into ``base``."""
    parts = [
        first_run(row, tmp_path, url, f"base-{i}", (*extra, f"experiment.shard={i}/{SHARDS}")) for i in range(SHARDS)
    ]
    base = tmp_path / "base"
    sources = [row.store_url(f"base-{i}") or str(part) for i, part in enumerate(parts)]
    merged = run_flowllm("merge", *sources, "-o", str(base))
    assert merged.returncode == ExitCode.OK, merged.stderr[-3000:]
    assert sorted(statuses(base)) == sorted(t for part in parts for t in statuses(part))
    assert_verified(row, base)
    return base


def check_row(row: Row, tmp_path: Path, url: str, receiver: type[_Receiver], redis: str | None) -> None:
    before = receiver.received
    # The first run's processes keep their spend and rate limits together in Redis, under the row's own key.
    extra = (f"experiment.coordination='{redis}?run={row.name}'",) if redis is not None else ()
    if row.shard == "on":
        base = merged_shards(row, tmp_path, url, extra)
    else:
        base = first_run(row, tmp_path, url, "base", extra)
    if row.faults == "on" and row.batch == "off":  # the faults happened; empty replies billed as a provider bills them
        lines = [LedgerLine.from_dict(orjson.loads(raw)) for raw in (base / "usage.jsonl").read_bytes().splitlines()]
        empty = [line for line in lines if line.outcome == "empty_reply"]
        assert empty and all(line.billed and (line.cost_usd or 0) > 0 for line in empty)
    if row.telemetry == "on":
        assert receiver.received > before, "telemetry was on, yet no span reached the receiver"
    # Published as a bundle, the run is reproduced offline from it, every number again; a run its budget stopped
    # too: its stopped tasks stop where they did, those it never started do not start.
    if row.then == "none":
        make_bundle(base, tmp_path / "run.tar.zst")
        verified = run_flowllm("verify", str(tmp_path / "run.tar.zst"), "--dataset", str(MATRIX))
        assert verified.returncode == ExitCode.OK, verified.stdout[-3000:] + verified.stderr[-3000:]
    if row.then in ("replay", "fork", "fork_at_turn"):
        follow = tmp_path / row.then
        run_ok(*row.overrides(url, row.then), *row.follow_up(base), f"hydra.run.dir={follow}", exits=FOLLOW_UP_EXITS)
        assert_verified(row, follow)
        assert_stored(row, row.then, follow)
    if row.then == "replay":  # a plain replay ends every task as the saved run did, a budget's stop included
        assert statuses(follow) == statuses(base)


def statuses(run: Path) -> dict[str, tuple[str, int]]:
    """Each task's status and turns, by its id."""
    results = (TaskResult.from_dict(orjson.loads(p.read_bytes())) for p in run.glob("tasks/*/result.json"))
    return {r.task_id: (r.status, r.turns) for r in results}
