"""What every benchmark shares: repeated timing with median/min/max, the machine, Markdown tables, targets.

A benchmark module exposes ``run(sizes: Sizes) -> Section``; ``benchmarks/run.py`` runs them in order and
writes their sections into ``benchmarks/results.md``. Nothing here imports flowllm, so the helpers stay cheap
to import in the subprocesses some benchmarks start.
"""

from __future__ import annotations

import gc
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent


@dataclass(frozen=True)
class Stat:
    """The median of several runs, with their min and max (all in the unit the caller measured)."""

    median: float
    min: float
    max: float
    runs: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stat:
        if not samples:
            raise ValueError("no samples")
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    def scaled(self, factor: float) -> Stat:
        return Stat(self.median * factor, self.min * factor, self.max * factor, self.runs)

    def fmt(self, digits: int = 1, unit: str = "") -> str:
        """``median (min-max)``: the form every table cell uses."""
        return f"{self.median:,.{digits}f}{unit} ({self.min:,.{digits}f}-{self.max:,.{digits}f})"


def repeat(fn: Callable[[], float], runs: int) -> Stat:
    """Call ``fn`` (which returns one measurement) ``runs`` times."""
    return Stat.of([fn() for _ in range(runs)])


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark is. ``full()`` is what results.md is made with; ``quick()`` is the smoke test."""

    runs: int  # repetitions behind each median
    overhead_turns: int  # turns per repetition of the engine-overhead benchmark
    peer_turns: int  # the same for LangGraph and Haystack (they are 100x slower)
    recorder_turns: int
    fanout_k: tuple[int, ...]
    tool_seconds: float
    concurrency: tuple[int, ...]
    concurrency_turns: int
    latency_s: float
    replay_tasks: int  # tasks of the saved run to replay; x replay_turns turns
    replay_turns: int
    parsing_min_time: float
    # Run the per-level processes of the concurrency and replay benchmarks inside this process instead: their
    # memory and one-core figures then mean nothing, but a smoke test saves the start-up of each process.
    in_process: bool = False
    # Repetitions per concurrency level (same order as ``concurrency``); empty: ``runs`` at every level. The top
    # levels take minutes per repetition, so they get fewer.
    concurrency_runs: tuple[int, ...] = ()

    def runs_at(self, level: int) -> int:
        """How many times the concurrency benchmark runs ``level`` tasks at once."""
        if self.concurrency_runs and level in self.concurrency:
            return self.concurrency_runs[self.concurrency.index(level)]
        return self.runs

    # The start-up benchmark: fresh `python -m flowllm` runs behind each figure, and the sample's tasks per run
    # (None: all of them).
    startup_runs: int = 3
    startup_limit: int | None = None

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            runs=5,
            overhead_turns=4000,
            peer_turns=400,
            recorder_turns=300,
            fanout_k=(1, 4, 16),
            tool_seconds=0.2,
            concurrency=(1, 10, 100, 500, 2000),
            concurrency_runs=(5, 5, 5, 3, 2),
            concurrency_turns=5,
            latency_s=0.1,
            replay_tasks=200,
            replay_turns=5,
            parsing_min_time=0.3,
        )

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            runs=1,
            overhead_turns=20,
            peer_turns=5,
            recorder_turns=5,
            fanout_k=(1, 2),
            tool_seconds=0.01,
            concurrency=(3,),  # one level: each starts the workers' and Inspect AI's processes
            concurrency_turns=2,
            latency_s=0.01,
            replay_tasks=3,
            replay_turns=2,
            parsing_min_time=0.0,
            in_process=True,
            startup_runs=1,
            startup_limit=1,
        )


@dataclass
class Target:
    """One target of the issue and whether this run met it (None: could not be measured here)."""

    what: str
    target: str
    measured: str
    met: bool | None

    @property
    def verdict(self) -> str:
        return {True: "met", False: "**not met**", None: "not measured"}[self.met]


@dataclass
class Section:
    """One benchmark's part of results.md."""

    title: str
    intro: str
    tables: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # raw figures, for the smoke test and results.json

    def markdown(self) -> str:
        parts = [f"## {self.title}", "", self.intro.strip(), ""]
        for table in self.tables:
            parts += [table, ""]
        if self.targets:
            parts += [
                md_table(
                    ["target", "wanted", "measured", ""],
                    [[t.what, t.target, t.measured, t.verdict] for t in self.targets],
                ),
                "",
            ]
        for note in self.notes:
            parts += [note.strip(), ""]
        return "\n".join(parts)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; the first column is left-aligned, the others right-aligned (they hold numbers)."""
    align = [":--"] + ["--:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return None


def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=5)
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def machine_info() -> dict[str, str]:
    """What the figures depend on: the CPU, how many cores this process may use, memory, Python, libraries."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = _memory_gb()
    info = {
        "cpu": _cpu_model(),
        "cores": f"{usable} usable of {os.cpu_count()}",
        "memory": f"{memory:.1f} GB" if memory else "unknown",
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
    libs = ["flowllm", "anthropic", "openai", "httpx2", "orjson", "networkx", "langgraph", "haystack-ai", "inspect-ai"]
    versions = {d: version_of(d) or "not installed" for d in libs}
    if versions["flowllm"] == "not installed":
        versions["flowllm"] = "(run from the source tree)"
    info["libraries"] = ", ".join(f"{d} {v}" for d, v in versions.items())
    revision = _git_revision()
    if revision:
        info["flowllm revision"] = revision
    return info


def subprocess_env() -> dict[str, str]:
    """The environment for benchmark subprocesses: the project importable, peers' telemetry off."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(quiet_peers_env())
    return env


def quiet_peers_env() -> dict[str, str]:
    # Haystack reports usage to a remote server and LangChain may trace to one; the benchmark is offline.
    return {"HAYSTACK_TELEMETRY_ENABLED": "False", "LANGCHAIN_TRACING_V2": "false", "LANGSMITH_TRACING": "false"}


def python() -> str:
    return sys.executable


class GcClock:
    """The time the cyclic garbage collector spends while the block runs (``gc.callbacks``), in seconds.

    A sampling profiler sees no frame of the collector's own: its time lands on whichever frame allocated when a
    collection began. Timed apart, it can be shown as its own line of the profile.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class CpuClock:
    """This process's CPU time (all its threads) while the block runs, user and system apart (``getrusage``):
    a run's own files cost system time, which ``time.process_time`` adds in unseen."""

    def __init__(self) -> None:
        self.user_s = 0.0
        self.sys_s = 0.0
        self._began = resource.getrusage(resource.RUSAGE_SELF)

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s

    def __enter__(self) -> CpuClock:
        self._began = resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc: object) -> None:
        ended = resource.getrusage(resource.RUSAGE_SELF)
        self.user_s = ended.ru_utime - self._began.ru_utime
        self.sys_s = ended.ru_stime - self._began.ru_stime


def file_creation_us(folder: Path, files: int = 200) -> float:
    """Kernel CPU microseconds to create one small file in a new folder under ``folder``: what a run's records
    cost on that disk (about 15 on a tmpfs here, up to 1,000 on an ext4 that freed many inodes moments before). The
    files are left in place: removing them would make the next ones slower to create."""
    target = Path(folder) / f"probe-{time.monotonic_ns()}"
    target.mkdir()
    began = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    for index in range(files):
        (target / f"f{index}.json").write_bytes(b"{}")
    return (resource.getrusage(resource.RUSAGE_SELF).ru_stime - began) / files * 1e6


def peak_rss_mb() -> float:
    """This process's peak resident memory.

    Linux's VmHWM first: ``ru_maxrss`` survives ``exec``, so a child started by a big parent would report the
    parent's peak (the benchmark's own process holds LangGraph and Haystack by then).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024
