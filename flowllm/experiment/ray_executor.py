"""``experiment.executor=ray``: the workers of one run (flowllm/experiment/workers.py) as Ray tasks of a cluster.

Everything else is the local executor's: the parent deals the tasks into ``experiment.workers`` shards, follows
the ``result.json`` files as they appear and writes the one summary. Each shard is one Ray task that starts the
same worker command a local run starts (``python -m flowllm ... experiment.worker_shard=...``) on whichever node
Ray places it, and returns its exit code. So the run directory, the dataset and the same Python environment must
be on every node at the same paths (shared storage), and every node's environment must hold the API keys.

Before the first task the parent runs one check on every alive node: that it sees the run directory and can write
there. A node that cannot stops the run with one line. ``experiment.ray_address`` is passed to ``ray.init``:
null starts a local instance (or joins the cluster named by ``$RAY_ADDRESS``), ``auto`` joins the cluster this
machine is part of, ``ray://host:10001`` a remote one. Ctrl-C cancels the Ray tasks, which forward SIGINT to
their workers: each keeps what finished and exits 130, as with local workers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

from flowllm.errors import ConfigError
from flowllm.experiment.children import die_with, shard_override
from flowllm.providers.limiter import SHARED_PAUSES_ENV

INSTALL_HINT = "pip install 'flowllm[ray]'"


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


def _sees_run_dir(run_dir: str) -> str | None:
    """On one node: None when the run directory is there and writable, else why not (with the node's name)."""
    folder = Path(run_dir)
    node = socket.gethostname()
    if not folder.is_dir():
        return f"node {node} does not see the run directory {run_dir}"
    probe = folder / f".node-check-{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"node {node} cannot write into the run directory {run_dir}: {exc.strerror or exc}"
    return None


def check_nodes(ray: Any, run_dir: Path) -> None:
    """Every alive node sees the run directory, or the run stops before its first task with one line."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    check = ray.remote(num_cpus=0)(_sees_run_dir)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [
        check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(run_dir.resolve())
        )
        for n in nodes
    ]
    problems = [p for p in ray.get(refs) if p]
    if problems:
        raise ConfigError(
            f"experiment.executor=ray: {problems[0]}: put hydra.run.dir (and the dataset) on storage every node "
            "sees, at the same path"
        )


def run_worker(command: list[str], shard: dict[str, Any], cwd: str, shared_pauses: str) -> int:
    """A Ray task: one worker of the run, as a process of this node; its exit code. A cancellation (the
    parent's Ctrl-C) is forwarded to the worker as SIGINT, which keeps what finished and exits 130."""
    with tempfile.TemporaryDirectory(prefix="flowllm-ray-worker-") as scratch:
        path = Path(scratch) / f"shard-{shard['index']}.json"
        path.write_bytes(orjson.dumps({**shard, "parent_pid": os.getpid()}))
        proc = subprocess.Popen(
            [*command, shard_override(path)],
            cwd=cwd,
            env={**os.environ, SHARED_PAUSES_ENV: shared_pauses},
            preexec_fn=die_with(os.getpid()),
        )
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()


@dataclass
class RayPool:
    """The run's workers as Ray tasks; the same face as the local pool (workers.py)."""

    ray: Any
    refs: list[Any] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)
    signals: int = 0
    failure: str | None = None
    _cancelled: bool = False

    def start(self, command: list[str], shard: dict[str, Any], shared_pauses: str) -> None:
        task = self.ray.remote(num_cpus=1, max_retries=0)(run_worker)
        self.refs.append(task.remote(command, shard, os.getcwd(), shared_pauses))

    def forward(self, signum: int, frame: FrameType | None = None) -> None:
        self.signals += 1
        for ref in self.refs:
            self.ray.cancel(ref)

    def _collect(self) -> None:
        for index, ref in enumerate(self.refs):
            if index in self.codes:
                continue
            ready, _ = self.ray.wait([ref], timeout=0)
            if not ready:
                continue
            try:
                self.codes[index] = int(self.ray.get(ref))
            except Exception as exc:  # the Ray task itself failed (a node lost, a cancellation)
                self.codes[index] = 130 if self.signals else 1
                if not self.signals and self.failure is None:
                    self.failure = f"worker {index + 1} of {len(self.refs)} failed in Ray: {type(exc).__name__}"

    def alive(self) -> bool:
        self._collect()
        return len(self.codes) < len(self.refs)

    def check(self) -> None:
        """A worker that failed on its own stops the run: its peers are cancelled."""
        self._collect()
        if self.signals:
            return
        if self.failure is None:
            for index, code in sorted(self.codes.items()):
                if code != 0:
                    self.failure = f"worker {index + 1} of {len(self.refs)} exited with code {code}"
                    break
        if self.failure is not None and not self._cancelled:
            self._cancelled = True
            for ref in self.refs:
                self.ray.cancel(ref)
