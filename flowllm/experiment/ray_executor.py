"""``experiment.executor=ray``: the workers of one run (flowllm/experiment/workers.py) as Ray tasks of a cluster,
with no path the driver and the nodes share.

Everything else is the local executor's: the driver deals the tasks into ``experiment.workers`` shards, follows
the ``result.json`` files as they appear in its run folder and writes the one summary. Each shard is one Ray task
that unpacks what the driver shipped through Ray's object store (the paths of the command line, the run's
ledgers, the unfinished tasks' folders: ray_files.py) into a scratch folder of its node, starts the same worker
command a local run starts (``python -m flowllm ... experiment.worker_shard=...``) with its run folder there, and
sends the finished tasks' folders and the ledgers' new lines back as they appear; the driver writes them into
its run folder. Every node needs flowllm installed (the same version) and the API keys in its environment.

Each worker holds 1/N of the provider's rate limits (as local workers do) and of what the run's budget had left
when it started (``budget_share``); a 429's pause stays within the worker. ``experiment.ray_address`` is passed
to ``ray.init``: null starts a local instance (or joins the cluster named by ``$RAY_ADDRESS``), ``auto`` joins
the cluster this machine is part of, ``host:port`` or ``ray://host:10001`` a remote one. Ctrl-C stops the workers
through the same actor that carries flowllm ctl's state: each keeps what finished, sends it and exits 130, as
local workers do; a second Ctrl-C cancels the Ray tasks.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

from flowllm.core.scratch import scratch as scratch_folder
from flowllm.errors import ConfigError
from flowllm.experiment.children import die_with, quoted, shard_override
from flowllm.experiment.ray_files import (
    RUN_DIR,
    Batch,
    FolderSender,
    follow_state,
    receive,
    scratch_env,
    ship_inputs,
    unpack,
)
from flowllm.rundir.control import ControlPaths
from flowllm.spend.spending import RunBudget, SpendBook

INSTALL_HINT = "pip install 'flowllm[ray]'"
POLL_S = 0.5  # how often a Ray task looks for its worker's finished tasks


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"experiment.executor=ray needs Ray: {INSTALL_HINT}") from None
    return ray


def connect(address: str | None) -> Any:
    """``ray.init`` once for the run; a cluster that cannot be reached is one line."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or os.environ.get("RAY_ADDRESS") or "a new local instance"
        raise ConfigError(f"experiment.executor=ray: cannot reach Ray at {where}: {exc}") from None
    return ray


def cluster_cpus(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def budget_share(budget: RunBudget, run_dir: Path, workers: int) -> dict[str, Any] | None:
    """One Ray worker's budget: what the run spent before (its ledger is shipped to every worker) and 1/N of
    what was left, so the workers together stop within their turns in flight of the run's budget."""
    if not budget.active:
        return None
    spent = SpendBook.of_run(run_dir).total()
    share: dict[str, Any] = {"cost_usd": None, "tokens": None}
    if budget.cost_usd is not None:
        share["cost_usd"] = cost_share(budget.cost_usd, spent.cost_usd, workers)
    if budget.tokens is not None:
        share["tokens"] = spent.tokens + max(1, (budget.tokens - spent.tokens) // workers)
    return share


def cost_share(cost_usd: float, spent_before: float, workers: int) -> float:
    """One Ray worker's part of a run budget of ``cost_usd`` (set at start, or by ``flowllm ctl`` while it runs):
    what the run had spent when the workers started (every worker's ledger begins with it) and 1/N of the rest.
    Each worker sees its own ledger only; held to the whole budget each, N workers could spend N times it."""
    return spent_before + max(0.0, cost_usd - spent_before) / workers


class ControlRelay:
    """A Ray actor: the driver's latest ``.control/state.json`` (flowllm ctl), which every Ray task copies into
    its worker's folder, and whether the run is stopping (Ctrl-C, a failed worker)."""

    def __init__(self) -> None:
        self.state = b""
        self.stopping = False

    def put(self, state: bytes) -> None:
        self.state = state

    def stop(self) -> None:
        self.stopping = True

    def get(self) -> tuple[bytes, bool]:
        return self.state, self.stopping


def run_worker(args: list[str], shard: dict[str, Any], inputs: bytes, relay: Any) -> Iterator[Batch | int]:
    """A Ray task (a generator): one worker of the run, as a process of this node running in a scratch folder
    of its own. Yields the ``Batch``es of its run folder as its tasks finish, then its exit code. A
    cancellation (the driver's Ctrl-C) is forwarded to the worker as SIGINT, which keeps what finished and
    exits 130."""
    with scratch_folder("flowllm-ray-worker-") as root:
        unpack(inputs, root)
        run_dir = root / RUN_DIR
        run_dir.mkdir(exist_ok=True)
        path = root / "shard.json"
        path.write_bytes(orjson.dumps({**shard, "parent_pid": os.getpid()}))
        command = [sys.executable, "-m", "flowllm", *args, f"hydra.run.dir={quoted(str(run_dir))}"]
        sender = FolderSender(run_dir, list(shard["task_ids"]))
        proc = subprocess.Popen(
            [*command, shard_override(path)], cwd=root, env=scratch_env(root), preexec_fn=die_with(os.getpid())
        )
        stopped = False
        try:
            while proc.poll() is None:
                state, stopping = _ray().get(relay.get.remote())
                follow_state(state, run_dir)
                if stopping and not stopped:  # the worker keeps what finished and exits 130; it is sent below
                    stopped = True
                    proc.send_signal(signal.SIGINT)
                batch = sender.poll()
                if batch:
                    yield batch
                time.sleep(POLL_S)
        except KeyboardInterrupt:  # cancelled (a second Ctrl-C of the driver)
            proc.send_signal(signal.SIGINT)
            proc.wait()
        yield sender.poll(final=True)
        yield int(proc.wait())


@dataclass
class RayPool:
    """The run's workers as Ray tasks; the same face as the local pool (workers.py). Each worker's batches are
    taken from Ray by a thread of its own and written into the run folder by the driver's loop."""

    ray: Any
    run_dir: Path
    refs: list[Any] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)
    signals: int = 0
    failure: str | None = None
    _cancelled: bool = False
    _inbox: queue.Queue[tuple[int, Batch | int | BaseException]] = field(default_factory=queue.Queue)
    _relay: Any = None
    _state: bytes = b""

    def start(self, command: list[str], shard: dict[str, Any]) -> None:
        args, inputs = ship_inputs(command, self.run_dir, list(shard["task_ids"]))
        if self._relay is None:
            self._relay = self.ray.remote(num_cpus=0)(ControlRelay).remote()
        task = self.ray.remote(num_cpus=1, max_retries=0, num_returns="streaming")(run_worker)
        stream = task.remote(args, shard, inputs, self._relay)
        self.refs.append(stream)
        index = len(self.refs) - 1
        threading.Thread(target=self._take, args=(index, stream), name=f"flowllm-ray-{index}", daemon=True).start()

    def _take(self, index: int, stream: Any) -> None:
        try:
            for ref in stream:
                self._inbox.put((index, self.ray.get(ref)))
        except BaseException as exc:  # the Ray task itself failed (a node lost, a cancellation)
            self._inbox.put((index, exc))

    def forward(self, signum: int, frame: FrameType | None = None) -> None:
        """The first Ctrl-C stops the workers through the relay (what they finished still comes back); a second
        one cancels the Ray tasks and stops waiting for them."""
        self.signals += 1
        if self.signals == 1:
            self._stop()
            return
        for index, ref in enumerate(self.refs):
            self.ray.cancel(ref)
            self.codes.setdefault(index, 130)

    def _stop(self) -> None:
        if self._relay is not None and not self._cancelled:
            self._cancelled = True
            self._relay.stop.remote()

    def _relay_state(self) -> None:
        """flowllm ctl's state, as the driver wrote it, to the relay the workers follow."""
        try:
            state = ControlPaths(self.run_dir).state.read_bytes()
        except OSError:
            return
        if state != self._state and self._relay is not None:
            self._state = state
            self._relay.put.remote(state)

    def _collect(self) -> None:
        self._relay_state()
        while True:
            try:
                index, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Batch):
                receive(item, self.run_dir)
            elif isinstance(item, int):
                self.codes[index] = item
            elif index not in self.codes:
                self.codes[index] = 130 if self.signals else 1
                if not self.signals and self.failure is None:
                    self.failure = f"worker {index + 1} of {len(self.refs)} failed in Ray: {type(item).__name__}"

    def alive(self) -> bool:
        self._collect()
        return len(self.codes) < len(self.refs)

    def check(self) -> None:
        """A worker that failed on its own stops the run: its peers are stopped."""
        self._collect()
        if self.signals:
            return
        if self.failure is None:
            for index, code in sorted(self.codes.items()):
                if code != 0:
                    self.failure = f"worker {index + 1} of {len(self.refs)} exited with code {code}"
                    break
        if self.failure is not None:
            self._stop()
