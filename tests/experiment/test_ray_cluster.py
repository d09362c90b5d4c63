"""experiment.executor=ray on a cluster of three nodes that share no folder: a head and two worker nodes started
here as separate ``ray start`` processes (127.0.0.1), each with its own temp dir and working folder. A run
connected to it equals a one-process run of the same tasks, task by task (result.json, answers, the ledger's
totals), and ``flowllm verify`` passes on it; a rerun resumes an unfinished task from the turns the driver
shipped. The worker's command line names no path of the driver's."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flowllm.engine.recorder import read_json
from flowllm.experiment.ray_executor import budget_share
from flowllm.experiment.ray_files import INPUTS_DIR, ship_inputs
from flowllm.experiment.workers import share_set_budget
from flowllm.run.control import RunControl
from flowllm.rundir.results import RunSummary, TaskResult
from flowllm.spend.spending import RunBudget, SpendBook
from tests.experiment.helpers import ROOT, run_flowllm
from tests.experiment.test_workers import HANG_GUARD_S, assert_same_runs

HAS_RAY = importlib.util.find_spec("ray") is not None and shutil.which("ray") is not None
pytestmark = [
    pytest.mark.long,
    pytest.mark.skipif(not HAS_RAY, reason="the ray extra is not installed (pip install 'flowllm[ray]')"),
]

IDS = ("sample-03-percentage", "sample-07-department", "sample-09-arithmetic")  # math and Python only
SAMPLE = (
    f"dataset.task_ids=[{','.join(IDS)}]",
    "progress=false",
    "~tools.servers.tool-files",
    # Named on the command line, so a Ray worker gets them shipped (it is not given the driver's paths).
    f"dataset.path={ROOT / 'flowllm/data/sample'}",
    f"provider.emulator_script={ROOT / 'flowllm/data/sample/script.yaml'}",
)
NODE_START_S = 120.0
# The cluster listens on 127.0.0.1 only; without this, Ray turns token authentication on where a token file of
# this user exists, which nodes started by `ray start --address` do not read.
RAY_START = ("ray", "start", "--block", "--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats")
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


PORT_OPTIONS = (
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
)


def _free_ports(count: int) -> list[int]:
    """``count`` different free ports (all held open while chosen, so none is chosen twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _ports(ports: list[int]) -> list[str]:
    """Every port a node opens, given: several nodes of one machine (and other Ray users) must not clash."""
    return [f"--{name}={port}" for name, port in zip(PORT_OPTIONS, ports, strict=True)]


def _start_node(root: Path, name: str, ports: list[int], *args: str) -> subprocess.Popen[bytes]:
    folder = root / name
    (folder / "work").mkdir(parents=True)
    log = (folder / "ray-start.log").open("wb")
    return subprocess.Popen(
        [*RAY_START, *args, f"--temp-dir={folder / 'tmp'}", *_ports(ports)],
        cwd=folder / "work",
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped at teardown, and no other Ray of this machine
        env={**os.environ, **RAY_ENV, "TMPDIR": str(folder / "work")},  # the node's scratch folders are its own
    )


def _alive_nodes(address: str) -> int:
    probe = (
        f"import ray; ray.init(address={address!r}, log_to_driver=False, configure_logging=False); "
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    env = {**os.environ, **RAY_ENV}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=NODE_START_S, env=env)
    return int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 and proc.stdout.strip() else 0


def _stop(nodes: list[subprocess.Popen[bytes]]) -> None:
    """Each node's process group (its ``ray start`` and the processes it started), and nothing else."""
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):  # what is left of the group
            os.killpg(node.pid, signal.SIGKILL)
        node.wait()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A head and two worker nodes on 127.0.0.1 as separate processes; its GCS address."""
    # A short path: Ray's socket names must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="flowllm-ray-"))
    ports = _free_ports(1 + 3 * len(PORT_OPTIONS))
    address = f"127.0.0.1:{ports[0]}"
    own = [ports[1 + i * len(PORT_OPTIONS) : 1 + (i + 1) * len(PORT_OPTIONS)] for i in range(3)]
    nodes = [_start_node(root, "head", own[0], "--head", f"--port={ports[0]}", "--include-dashboard=false")]
    nodes.append(_start_node(root, "w1", own[1], f"--address={address}"))
    nodes.append(_start_node(root, "w2", own[2], f"--address={address}"))
    try:
        deadline = time.monotonic() + NODE_START_S
        while _alive_nodes(address) < 3:
            dead = [n for n in nodes if n.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "".join((root / n / "ray-start.log").read_text()[-1500:] for n in ("head", "w1", "w2"))
                pytest.fail(f"the Ray cluster did not come up with three nodes: {logs}")
            time.sleep(1.0)
        yield address
    finally:
        _stop(nodes)
        shutil.rmtree(root, ignore_errors=True)


def _on(address: str, workers: int = 3) -> tuple[str, ...]:
    return ("experiment.executor=ray", f"experiment.workers={workers}", f"experiment.ray_address={address}")


@pytest.fixture(scope="module")
def runs(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ray-cluster")

    def one(extra: tuple[str, ...]) -> Path:
        run_dir = root / ("ray" if extra else "one")
        proc = run_flowllm(*SAMPLE, *extra, f"hydra.run.dir={run_dir}", env=RAY_ENV, timeout=HANG_GUARD_S)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return run_dir

    with ThreadPoolExecutor(2) as pool:
        single, on_ray = pool.map(one, ((), _on(ray_cluster)))
    return {"one": single, "ray": on_ray}


def test_a_run_on_three_nodes_equals_one_process_task_by_task(runs: dict[str, Path]) -> None:
    assert_same_runs(runs["one"], runs["ray"])  # every file (result.json but timings), answers, ledger totals
    summary = RunSummary.from_dict(read_json(runs["ray"] / "summary.json"))
    assert (summary.status, summary.tasks, summary.completed) == ("finished", len(IDS), len(IDS))


def test_the_ray_run_verifies(runs: dict[str, Path]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flowllm", "verify", str(runs["ray"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0 and ": verified (" in proc.stdout, proc.stdout + proc.stderr


def test_the_worker_is_given_no_path_of_the_driver(tmp_path: Path) -> None:
    """What a Ray task receives: the paths of the command line are shipped and rewritten; the run's own folder
    is the worker's scratch folder."""
    dataset = ROOT / "tests/experiment/data/gaia"
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "flowllm", "--config-dir", str(dataset), f"dataset.path={dataset}"]
    command += [f"hydra.run.dir={run_dir}", "tools=default", "hydra.job.name=app"]
    args, blob = ship_inputs(command, run_dir, ["t1"])
    shipped = ["--config-dir", f"{INPUTS_DIR}/0/gaia", f"dataset.path={INPUTS_DIR}/1/gaia"]
    assert args == [*shipped, "tools=default", "hydra.job.name=app"]
    assert str(tmp_path) not in " ".join(args) and str(dataset) not in " ".join(args)
    assert len(blob) > (dataset / "script.yaml").stat().st_size


def _result(run_dir: Path, task_id: str) -> TaskResult:
    return TaskResult.from_dict(read_json(run_dir / "tasks" / task_id / "result.json"))


@pytest.fixture(scope="module")
def resumed(runs: dict[str, Path], ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rerun on the cluster into a copy of the one-process run whose first task lost its result.json (its
    turns kept: resumed from them)."""
    run_dir = tmp_path_factory.mktemp("ray-resume") / "run"
    shutil.copytree(runs["one"], run_dir)
    (run_dir / "tasks" / IDS[0] / "result.json").unlink()
    proc = run_flowllm(*SAMPLE, f"hydra.run.dir={run_dir}", *_on(ray_cluster, 1), env=RAY_ENV, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def test_a_rerun_on_the_cluster_resumes_a_task_from_its_shipped_turns(runs: dict[str, Path], resumed: Path) -> None:
    """The task without result.json is run again by a Ray worker from the turns the driver shipped; the others
    are not run again."""
    run_dir = resumed
    summary = RunSummary.from_dict(read_json(run_dir / "summary.json"))
    assert (summary.status, summary.completed, summary.resumed_tasks) == ("finished", len(IDS), 1)
    for task_id in IDS[1:]:  # finished before: not run again
        assert (run_dir / "tasks" / task_id / "result.json").read_bytes() == (
            runs["one"] / "tasks" / task_id / "result.json"
        ).read_bytes()
    again, saved = _result(run_dir, IDS[0]), _result(runs["one"], IDS[0])
    assert (again.answer, again.correct) == (saved.answer, saved.correct)
    assert again.resumed_turns, "the task was run again from scratch, not from the shipped turns"
    assert not (run_dir / ".resume").exists()  # the turns set aside to resume from are gone, as with one process


def test_each_ray_worker_holds_its_share_of_what_the_budget_has_left(runs: dict[str, Path]) -> None:
    """Workers see their own ledger only (the run's, as it was, is shipped to each): each gets what the run spent
    before and 1/N of what was left, so together they spend at most what was left."""
    spent = SpendBook.of_run(runs["one"]).total()
    assert spent.cost_usd > 0 and spent.tokens > 0
    budget = RunBudget(cost_usd=spent.cost_usd + 0.03, tokens=spent.tokens + 3001)
    share = budget_share(budget, runs["one"], 3)
    assert share is not None
    assert share["cost_usd"] == pytest.approx(spent.cost_usd + 0.01)
    assert share["tokens"] == spent.tokens + 1000
    assert budget_share(RunBudget(), runs["one"], 3) is None  # no budget: none to share


def test_a_budget_set_by_ctl_is_shared_like_the_starting_one(tmp_path: Path) -> None:
    """`flowllm ctl set experiment.budget.cost_usd=X` during a Ray run: each of three workers, seeing only its
    own ledger (which begins with the $0.30 the run had spent), holds $0.30 + 1/3 of the rest, so together they
    stop at X, not at three times it."""
    held: list[float] = []
    control = RunControl(tmp_path, 4, 0, 3, on_budget=held.append)
    share_set_budget(control, 0.30, 3)
    assert control.on_budget is not None
    control.on_budget(1.20)
    control.on_budget(0.10)  # below what was spent already: nothing more to spend
    assert held == [pytest.approx(0.60), pytest.approx(0.30)]
    assert 0.30 + 3 * (held[0] - 0.30) == pytest.approx(1.20)
