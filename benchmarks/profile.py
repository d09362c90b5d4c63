"""Where flowllm's CPU goes per turn: a sampling profile of the concurrency and replay workloads, by component.

The concurrency benchmark's child (N tasks x T turns against the emulator, the real stack) and the replay
benchmark's child (a saved run re-processed with ``provider=replay``) each run under py-spy, which samples the
process's stacks without instrumenting it (``--nonblocking``: the process is never paused; ``--gil``: only the
thread holding the interpreter lock, so a thread waiting in a file-system call is not counted as busy). The
bare-SDK floor (``benchmarks/floor.py``) is sampled the same way, so the SDK's own share is measured, not assumed.

Each sample is given to one component by its stack, read from the innermost frame outwards: the first frame that
belongs to a component names it. Frames of general-purpose libraries (pydantic, json, copy, typing, logging,
tenacity...) belong to no component, so their time goes to the code that called them: pydantic validation run by
the Anthropic SDK counts as the SDK's, the same validation run by flowllm's normaliser as the normaliser's. Only
samples taken inside the timed part of the run count, the part whose CPU time the figures divide: flowllm's
``Experiment.run`` and the floor's tasks (``one_task``), with the event loop and the worker threads while they
run. Imports, config composition, opening the provider, the floor's untimed warm-up call and closing are left
out (``in_timed_part``). The cyclic garbage collector leaves no frame of its own (py-spy charges it to whichever
frame allocated), so the children time it apart (``GcClock``) and it is a line of its own.

    pip install py-spy && python -m benchmarks.profile [--tasks 500] [--turns 5] [--replay-tasks 400]

The table goes to stdout; ``python -m benchmarks --only profile`` puts it into results.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/profile.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Section, Sizes, md_table, python, subprocess_env

RATE_HZ = 250
REPEATS = 2  # profiled runs of each command, their samples added up
_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^():]*)(?::(?P<line>\d+))?\)$")

# Libraries whose time is charged to their caller: they do work on behalf of whichever component called them.
NEUTRAL = (
    "/pydantic/",
    "/pydantic_core/",
    "/json/",
    "/orjson",
    "/copy.py",
    "/typing.py",
    "/typing_extensions.py",
    "/dataclasses.py",
    "/enum.py",
    "/functools.py",
    "/abc.py",
    "/re/",
    "/re.py",
    "/collections/",
    "/logging/",
    "/tenacity/",
    "/aiolimiter/",
    "/contextlib.py",
    "/uuid.py",
    "/datetime.py",
    "/base64.py",
    "/hashlib.py",
    "/string.py",
    "/textwrap.py",
    "/weakref.py",
    "/_weakrefset.py",
    "/random.py",
    "/inspect.py",
    "/threading.py",
    "/queue.py",
    "/pathlib.py",
    "/posixpath.py",
    "/os.py",
    "/shutil.py",
    "/tempfile.py",
    "/genericpath.py",
    "/codecs.py",
    "/encodings/",
    "/email/",
    "/urllib/",
    "/json5/",
    "/networkx/",
    "/typing_inspection/",
    "/attr/",
    "/attrs/",
    "/annotated_types/",
)

SDK = "SDK and HTTP stack (anthropic, httpx, httpcore, h11, anyio)"
ASYNCIO = "asyncio scheduling, sockets and thread hand-off"
REQUEST = "request building (canonical -> wire)"
NORMALIZE = "response normalisation (wire -> ModelResponse)"
PROVIDER = "provider plumbing (retry, keys, limiter, breaker, send)"
PARSING = "tool-call parsing and JSON repair"
ENGINE = "engine loop (runner, contract checks, context)"
RECORDER = "recorder"
LEDGER = "ledger and progress"
DISPATCH = "tool dispatch (incl. the in-process calculator)"
AGENT = "agent loop (turn setup, answer extraction)"
NODES = "other turn nodes (history, cache marks, tokens, media)"
EXPERIMENT = "experiment runner and scoring"
WORKSPACE = "task workspaces (folders made and moved, in threads)"
REPLAY = "replay provider (finding and reading saved replies)"
CONFIG = "OmegaConf / Hydra access"
IMPORTS = "imports inside the run"
OTHER = "other"
GC = "cyclic garbage collector (timed apart)"

_SDK_PARTS: tuple[str, ...] = (
    "/anthropic/",
    "/openai/",
    "/httpx/",
    "/httpx2/",
    "/httpcore/",
    "/httpcore2/",
    "/h11/",
    "/anyio/",
)
_SDK_PARTS += ("/sniffio/",)
_SDK_PARTS += ("/idna/", "/certifi/", "/h2/", "/distro/", "/jiter/", "/ssl.py", "/socket.py", "/http/")
_ASYNCIO_PARTS = ("/asyncio/", "/selectors.py", "/uvloop/", "/concurrent/futures/")
_BUILD_WORDS = ("build", "wire_", "_wire", "to_wire", "request", "encode", "content_block", "message_param")
_NORMALIZE_WORDS = ("normalize", "normalise", "from_wire", "usage", "response")
# The protocol modules' helpers by name, where the words above cannot tell: the canonical history translated to
# wire blocks, and the reply's JSON decoded, reassembled from stream events and read.
_REQUEST_FUNCS = frozenset(
    {
        "_as_content",
        "_block",
        "_cache",
        "_input",
        "_message",
        "_messages",
        "_parts",
        "_shape",
        "_user_parts",
        "sendable",
        "strip_cache_control",
        "text_or_parts",
        "tool_call_arguments",
        "unshaped_request",
        "wire_tool_name",
    }
)
_NORMALIZE_FUNCS = frozenset(
    {
        "_body",
        "_has_prompt_count",
        "assemble_anthropic",
        "assemble_chat",
        "assemble_responses",
        "assemble_stream",
        "read_body",
        "tool_use_block",
        "usage_or_estimate",
    }
)
# Helpers both halves call (arguments text to dict and back): charged to the caller that says which half it is.
_SHARED_FUNCS = frozenset({"dump_arguments", "parse_arguments"})

# flowllm modules by path fragment, most specific first.
_FLOWLLM: tuple[tuple[str, str], ...] = (
    ("flowllm/providers/replay", REPLAY),
    ("flowllm/providers/ledger", LEDGER),
    ("flowllm/experiment/progress", LEDGER),
    ("flowllm/experiment/workspaces", WORKSPACE),
    ("flowllm/experiment/task_usage", LEDGER),
    ("flowllm/nodes/toolcalls", PARSING),
    ("flowllm/parsing/", PARSING),
    ("flowllm/nodes/dispatch", DISPATCH),
    ("flowllm/tools/", DISPATCH),
    ("flowllm/nodes/model", PROVIDER),
    ("flowllm/nodes/", NODES),
    ("flowllm/engine/recorder", RECORDER),
    ("flowllm/engine/blobs", RECORDER),
    ("flowllm/engine/", ENGINE),
    ("flowllm/agent/", AGENT),
    ("flowllm/experiment/", EXPERIMENT),
    ("flowllm/scoring/", EXPERIMENT),
    ("flowllm/datasets/", EXPERIMENT),
    ("flowllm/core/", ENGINE),
    ("benchmarks/", DISPATCH),
)

ORDER = (
    SDK,
    ASYNCIO,
    REQUEST,
    NORMALIZE,
    PROVIDER,
    REPLAY,
    PARSING,
    ENGINE,
    RECORDER,
    LEDGER,
    DISPATCH,
    AGENT,
    NODES,
    EXPERIMENT,
    WORKSPACE,
    CONFIG,
    IMPORTS,
    OTHER,
    GC,
)


def component(frames: list[tuple[str, str]]) -> str:
    """The component a sample belongs to; ``frames`` are (function, path) from the outermost to the innermost."""
    for func, path in reversed(frames):
        path = path.replace("\\", "/")
        if "<frozen importlib" in path:
            return IMPORTS
        if path.startswith("<frozen"):
            continue
        if not path.startswith("/"):  # py-spy names files relative to their sys.path entry
            path = "/" + path
        if any(part in path for part in NEUTRAL):
            continue
        if "flowllm/providers/" in path:
            fixed = next((name for frag, name in _FLOWLLM if frag in path), None)
            if fixed is not None:
                return fixed
            # py-spy names a function by its qualified name: "Class.method", "f.<locals>.<listcomp>".
            named = [part for part in func.split(".") if not part.startswith("<")]
            own = named[-1] if named else func
            if own in _SHARED_FUNCS:
                continue
            if own in _REQUEST_FUNCS:
                return REQUEST
            if own in _NORMALIZE_FUNCS:
                return NORMALIZE
            lowered = func.lower()
            if any(word in lowered for word in _NORMALIZE_WORDS) and "request" not in lowered:
                return NORMALIZE
            if any(word in lowered for word in _BUILD_WORDS):
                return REQUEST
            return PROVIDER
        for frag, name in _FLOWLLM:
            if frag in path:
                return name
        if any(part in path for part in _SDK_PARTS):
            return SDK
        if any(part in path for part in _ASYNCIO_PARTS):
            return ASYNCIO
        if "/omegaconf/" in path or "/hydra/" in path:
            return CONFIG
        return OTHER
    return OTHER


def parse_raw(text: str) -> Iterable[tuple[list[tuple[str, str]], int]]:
    """py-spy's ``--format raw`` lines: ``frame;frame;... count``, outermost first."""
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = []
        for raw in stack.split(";"):
            found = _FRAME.match(raw.strip())
            frames.append((found["func"], found["path"]) if found else (raw, ""))
        yield frames, int(count)


# The functions whose CPU time the benchmarks measure: flowllm's ``Experiment.run`` and the floor's tasks.
TIMED = ("Experiment.run", "one_task")
# The coroutines that hold a run's set-up and tear-down around the timed part (config, opening the provider,
# building the experiment, the floor's warm-up call, closing): a sample under one of them and under no timed
# function is not counted.
SETUP = ("run_experiment", "run_floor")
# Tear-down handed to threads after the timed part.
TEARDOWN = ("Recorder.close", "WorkspaceRoot.close")
_EVENT_LOOP = "BaseEventLoop.run_until_complete"
# Where the outermost frame of a stack that py-spy shows from a task or the event loop lies.
_TASK_ROOTS = ("flowllm/", "benchmarks/", *_ASYNCIO_PARTS)


def _is(func: str, names: tuple[str, ...]) -> bool:
    return any(func == name or func.startswith(name + ".") for name in names)


def in_timed_part(frames: list[tuple[str, str]]) -> bool:
    """Whether a sample was taken while the timed part ran.

    py-spy shows a task's stack from the task's own coroutine (the frames of the event loop that resumed it are
    not linked to it), so most samples of a run begin inside a task and name none of the functions above: those
    count, as do the event loop's own frames and the worker threads', which run only while tasks do. Samples of
    the main thread outside the event loop (imports, composing the config) and of the set-up and tear-down
    coroutines do not."""
    funcs = [func for func, _ in frames]
    if any(_is(func, TIMED) for func in funcs):
        return True
    if any(_is(func, SETUP) or _is(func, TEARDOWN) for func in funcs):
        return False
    if not funcs:
        return False
    if funcs[0] == "_run_module_as_main":  # the main thread: only its event loop runs the tasks
        return _EVENT_LOOP in funcs
    # A task's stack starts at its own coroutine (flowllm's or the benchmark's), a worker thread's at its
    # bootstrap, the event loop's callbacks in asyncio. A stack py-spy could not read to its root starts anywhere
    # else (in omegaconf, composing the config; in importlib): its place in the run is unknown, so it is left out
    # and the CPU is split by the samples whose place is known.
    root = frames[0][1]
    return funcs[0].startswith("Thread._bootstrap") or any(part in root for part in _TASK_ROOTS)


@dataclass(frozen=True)
class Profile:
    """Samples per component of one profiled process, the CPU it spent per unit of work, and the garbage
    collector's share of that CPU (timed apart: the collector has no frame of its own)."""

    counts: dict[str, int]
    cpu_ms_per_unit: float
    gc_ms_per_unit: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def ms(self, name: str) -> float:
        """A component's CPU per unit: the CPU outside the collector, split by the samples' shares."""
        if name == GC:
            return self.gc_ms_per_unit
        share = self.counts.get(name, 0) / self.total if self.total else 0.0
        return (self.cpu_ms_per_unit - self.gc_ms_per_unit) * share

    @classmethod
    def of(cls, runs: list[tuple[Counter[str], dict[str, Any]]], unit: str) -> Profile:
        """Several profiled runs of one command added up, per turn: ``unit`` names the figure divided (``cpu_s``
        or ``wall_s``)."""
        counts: Counter[str] = Counter()
        for found, _ in runs:
            counts.update(found)
        units = sum(max(figures["turns"], 1) for _, figures in runs)
        spent = sum(figures[unit] for _, figures in runs)
        collected = sum(figures.get("gc_s", 0.0) for _, figures in runs)
        return cls(dict(counts), 1000 * spent / units, 1000 * collected / units)


def profile_command(cmd: list[str], out: Path) -> tuple[Counter[str], str]:
    """Run ``cmd`` under py-spy; returns the samples per component and the command's stdout."""
    spy = shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    raw = out.with_suffix(".raw")
    full = [spy, "record", "--gil", "--nonblocking", "--format", "raw", "-r", str(RATE_HZ), "-o", str(raw), "--", *cmd]
    done = subprocess.run(full, capture_output=True, text=True, env=subprocess_env(), timeout=3600, check=False)
    if done.returncode != 0 or not raw.exists():
        raise RuntimeError(f"profiling {cmd[2:4]} failed:\n{done.stderr[-3000:]}")
    counts: Counter[str] = Counter()
    for frames, count in parse_raw(raw.read_text(encoding="utf-8")):
        if in_timed_part(frames):
            counts[component(frames)] += count
    return counts, done.stdout


def _profiled(cmd: list[str], out: Path) -> tuple[Counter[str], dict[str, Any]]:
    """One profiled run of a benchmark child: its samples per component and the figures it printed."""
    counts, stdout = profile_command(cmd, out)
    return counts, _last_json(stdout)


def _last_json(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]  # py-spy writes to stdout too
    return dict(json.loads(lines[-1]))


def measure(tasks: int, turns: int, replay_tasks: int, replay_turns: int, repeats: int = REPEATS) -> dict[str, Profile]:
    from benchmarks import replay
    from benchmarks.concurrency import EmulatorProcess, emulator_script
    from benchmarks.stack import multi_turn_answer

    sizes = Sizes.quick()
    sizes = Sizes(**{**sizes.__dict__, "concurrency_turns": turns, "latency_s": 0.1})
    profiles: dict[str, Profile] = {}
    with tempfile.TemporaryDirectory(prefix="flowllm-bench-profile-") as tmp:
        folder = Path(tmp)
        script = folder / "script.json"
        script.write_text(json.dumps(emulator_script(sizes)), encoding="utf-8")
        with EmulatorProcess(script) as emulator:
            live = [python(), "-m", "benchmarks.concurrency", "--child", "--tasks", str(tasks)]
            live += ["--turns", str(turns), "--latency", "0.1", "--base-url", emulator.base_url, "--snapshot", "none"]
            runs = []
            for n in range(repeats):
                (folder / f"live-{n}").mkdir()
                runs.append(_profiled([*live, "--folder", str(folder / f"live-{n}")], folder / f"live-{n}"))
            profiles["flowllm"] = Profile.of(runs, "cpu_s")
            floor_cmd = [python(), "-m", "benchmarks.floor", "--tasks", str(tasks), "--turns", str(turns)]
            floor_cmd += ["--base-url", emulator.base_url, "--answer", multi_turn_answer(turns)]
            runs = [_profiled(floor_cmd, folder / f"floor-{n}") for n in range(repeats)]
            profiles["floor"] = Profile.of(runs, "cpu_s")
        rsizes = Sizes(**{**sizes.__dict__, "replay_tasks": replay_tasks, "replay_turns": replay_turns})
        source, dataset, _ = replay.make_source(folder / "replay-source", rsizes)
        replay_cmd = [python(), "-m", "benchmarks.replay", "--child", "--source", str(source)]
        replay_cmd += ["--dataset", str(dataset), "--snapshot", "none", "--turns", str(replay_turns)]
        runs = []
        for n in range(repeats):
            out = folder / f"replay-out-{n}"
            runs.append(_profiled([*replay_cmd, "--folder", str(out)], folder / f"replay-{n}"))
        profiles["replay"] = Profile.of(runs, "wall_s")
    return profiles


def table(profiles: dict[str, Profile]) -> str:
    live, floor, rep = profiles["flowllm"], profiles["floor"], profiles["replay"]
    rows = []
    for name in ORDER:
        if name != GC and not any(p.counts.get(name) for p in profiles.values()):
            continue
        rows.append(
            [
                name,
                f"{live.ms(name):.3f}",
                f"{100 * live.ms(name) / max(live.cpu_ms_per_unit, 1e-9):.1f}%",
                f"{floor.ms(name):.3f}",
                f"{live.ms(name) - floor.ms(name):+.3f}",
                f"{1000 * rep.ms(name):.0f}",
            ]
        )
    rows.append(
        [
            "**total**",
            f"**{live.cpu_ms_per_unit:.3f}**",
            "100%",
            f"**{floor.cpu_ms_per_unit:.3f}**",
            f"**{live.cpu_ms_per_unit - floor.cpu_ms_per_unit:+.3f}**",
            f"**{1000 * rep.cpu_ms_per_unit:.0f}**",
        ]
    )
    headers = [
        "component",
        "live: CPU ms per turn",
        "live share",
        "floor: CPU ms per call",
        "live over floor, ms",
        "replay: us per turn",
    ]
    return md_table(headers, rows)


def summary(profiles: dict[str, Profile]) -> str:
    """What the table says about the distance between flowllm and the floor, in one paragraph."""
    live, floor = profiles["flowllm"], profiles["floor"]
    shared = (SDK, ASYNCIO, GC)
    gap = live.cpu_ms_per_unit - floor.cpu_ms_per_unit
    parts = {name: live.ms(name) - floor.ms(name) for name in shared}
    own = gap - sum(parts.values())  # every other row, the floor's few lines of tool handling netted out
    return (
        f"flowllm spends {live.cpu_ms_per_unit:.2f} ms of CPU per turn, the floor {floor.cpu_ms_per_unit:.2f} ms "
        f"per call: {gap:+.2f} ms. Of that, {parts[SDK]:+.2f} ms is the SDK and its HTTP stack doing the same "
        f"calls inside flowllm's process, {parts[ASYNCIO]:+.2f} ms the event loop and thread hand-offs, "
        f"{parts[GC]:+.2f} ms the garbage collector, and {own:+.2f} ms flowllm's own code (every other row, "
        "'other' included, net of the floor's few lines of tool handling). The SDK does less inside flowllm "
        "than in the floor: flowllm takes the reply's body as the server sent it (`with_raw_response`, decoded "
        "once, in the normalisation row) where the floor has the SDK build its pydantic model of the reply, as a "
        "plain `messages.create` does."
    )


def section_from(
    profiles: dict[str, Profile], tasks: int, turns: int, replay_tasks: int, repeats: int = REPEATS
) -> Section:
    intro = (
        f"`python -m benchmarks.profile`: py-spy samples ({RATE_HZ} Hz, non-blocking, `--gil`: only the thread "
        f"holding the interpreter lock, so threads waiting in file-system calls are not counted as busy) of "
        f"{repeats} runs each of the concurrency child at {tasks} tasks x {turns} turns (100 ms model latency, "
        f"recorder off), of the bare-SDK floor on the same emulator, and of a one-core replay of {replay_tasks} "
        "saved tasks (recorder off). Only the timed part of each run counts. Each sample goes to the component of "
        "its innermost frame that belongs to one; general-purpose libraries (pydantic, json, copy, logging, "
        "tenacity...) are charged to their caller. The cyclic garbage collector has no frame of its own (py-spy "
        "would charge it to whichever frame allocated), so its time is measured apart with `gc.callbacks` and "
        "the rest of the CPU is split by the sample shares. CPU per turn is the process's own CPU time (all "
        "threads) over the timed part; replay is wall time on one core."
    )
    return Section("Where the CPU goes per turn", intro, [table(profiles)], [summary(profiles)], [])


def run(sizes: Sizes) -> Section:
    if shutil.which("py-spy") is None:
        note = 'Not measured: py-spy is not installed (`pip install -e ".[bench]"`).'
        return Section("Where the CPU goes per turn", note, [], [], [])
    tasks = 20 if sizes.in_process else 500
    replay_tasks = 20 if sizes.in_process else 400
    repeats = 1 if sizes.in_process else REPEATS  # a smoke run profiles each command once
    profiles = measure(tasks, sizes.concurrency_turns, replay_tasks, sizes.replay_turns, repeats)
    return section_from(profiles, tasks, sizes.concurrency_turns, replay_tasks, repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--replay-tasks", type=int, default=400)
    parser.add_argument("--replay-turns", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the sample counts as JSON too")
    args = parser.parse_args(argv)
    profiles = measure(args.tasks, args.turns, args.replay_tasks, args.replay_turns)
    print(table(profiles))
    print()
    print(summary(profiles))
    if args.json:
        print(
            json.dumps(
                {
                    k: {"counts": p.counts, "cpu_ms": p.cpu_ms_per_unit, "gc_ms": p.gc_ms_per_unit}
                    for k, p in profiles.items()
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
