"""flowllm's benchmark suite: every figure of issue 9 in one run, written to ``benchmarks/results.md``.

    python -m benchmarks                 # everything, full sizes (about 10 minutes on 2 cores)
    python benchmarks/run.py --only overhead parallel   # merged into the results file: the other sections stay
    python -m benchmarks --quick --output /some/where.md   # tiny sizes: checks the script, measures nothing

Sections: engine overhead per node (with LangGraph and Haystack when installed: ``pip install -e ".[bench]"``),
parallel tool dispatch, concurrency at scale, replay throughput, instructions per turn counted by callgrind
(``benchmarks/instructions.py``; not counted under ``--quick``), a fork against a live re-run, the parsing table of
``benchmarks/parsing.py``,
rate limiting, adaptive concurrency against a rate-limited provider (``benchmarks/adaptive.py``),
the CPU per task of ``python -m flowllm`` on the sample, start-up included
(``benchmarks/startup.py``), and prompt caching under each context policy against the cache-optimal bound
(``benchmarks/cache.py``). Each figure is the median of several runs with its min and max, next to its reference
measured in the same run; the machine is described at the top.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/run.py`: make the project importable as a package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    BENCH_DIR,
    Section,
    Sizes,
    Target,
    machine_info,
    md_table,
    quiet_peers_env,
)
from benchmarks.merge import merge_sections

os.environ.update(quiet_peers_env())  # before any peer library is imported

RESULTS = BENCH_DIR / "results.md"

SECTIONS = (
    "overhead",
    "parallel",
    "concurrency",
    "profile",
    "replay",
    "instructions",
    "fork",
    "parsing",
    "adversarial",
    "ratelimit",
    "adaptive",
    "startup",
    "cache",
    "scale",
)


def parsing_section(sizes: Sizes) -> Section:
    """The parsing benchmark's own table (benchmarks/parsing.py, written for the parsing issue), included as
    printed."""
    from benchmarks import parsing

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        parsing.main(["--min-time", str(sizes.parsing_min_time)])
    text = out.getvalue().rstrip()
    intro = (
        "`python benchmarks/parsing.py`: flowllm's tool-call parsing and JSON repair next to `json_repair` and "
        "`json5` on the shared corpora (cases/s, best of several passes; see that file for the workloads)."
    )
    targets = [t for t in (_parsing_target(line) for line in text.splitlines()) if t is not None]
    return Section("Parsing", intro, ["```\n" + text + "\n```"], [], targets)


def adversarial_section(sizes: Sizes) -> Section:
    """Hostile replies at 10 KB, 100 KB and 1 MB (``benchmarks/parsing.py --adversarial``): growth per 10x."""
    from benchmarks import parsing
    from benchmarks.common import md_table

    quick = sizes.parsing_min_time <= 0
    shape_sizes = (1_000, 10_000) if quick else parsing.ADVERSARIAL_SIZES
    rows, worst = parsing.adversarial(shape_sizes)
    intro = (
        "`python benchmarks/parsing.py --adversarial`: replies written to make a parser go quadratic (issue 19), "
        "one shape per row, milliseconds at each size (best of 3 passes) and "
        "the growth per 10x of input: about 10x is linear, 100x quadratic. A growth in parentheses starts below "
        "10 ms, where it measures the memory hierarchy rather than the algorithm (compare the reference row, "
        "one regex pass over the text); the target reads the others. Rows of call blocks (`<tool_call>`, "
        "`[TOOL_CALLS]`) stop growing at 1,000 blocks, the per-format cap."
    )
    table = md_table(parsing.adversarial_headers(shape_sizes), rows)
    target = Target("worst growth per 10x of hostile input", "<= 15x", f"{worst:.1f}x", worst <= 15)
    return Section("Parsing hostile input", intro, [table], [], [target], {"worst_growth": worst})


_TARGET_LINE = re.compile(
    r"^\s*(?P<what>[^:]+):(?P<said>.*?)(?P<value>[\d.]+)x(?P<rest>[^(]*)"
    r"\(target (?P<op>[<>]=) (?P<goal>[\d.]+)x\)"
)


def _parsing_target(line: str) -> Target | None:
    """A target line printed by parsing.py (``name: ... 8.5x ... (target >= 5x)``) as a judged Target."""
    m = _TARGET_LINE.match(line)
    if m is None:
        return None
    value, goal = float(m["value"]), float(m["goal"])
    met = value >= goal if m["op"] == ">=" else value <= goal
    return Target(m["what"].strip(), f"{m['op']} {m['goal']}x", f"{m['value']}x", met)


def _runners() -> dict[str, Callable[[Sizes], Section]]:
    from benchmarks import (
        adaptive,
        cache,
        concurrency,
        fork,
        instructions,
        overhead,
        parallel,
        profile,
        ratelimit,
        replay,
        scale,
        startup,
    )

    return {
        "overhead": overhead.run,
        "parallel": parallel.run,
        "concurrency": concurrency.run,
        "profile": profile.run,
        "replay": replay.run,
        "instructions": instructions.run,
        "fork": fork.run,
        "parsing": parsing_section,
        "ratelimit": ratelimit.run,
        "adaptive": adaptive.run,
        "adversarial": adversarial_section,
        "startup": startup.run,
        "cache": cache.run,
        "scale": scale.run,
    }


def merge_note(only: list[str], info: dict[str, str], seconds: float) -> str:
    """What a section run on its own says under its heading, once merged into the results file."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{info.get('cpu', 'an unknown cpu')} ({info.get('cores', '?')} cores, {info.get('memory', '?')})"
    revision = info.get("flowllm revision", "unknown")
    return (
        f"_Run on its own on {now} (`python -m benchmarks --only {' '.join(only)}`, {seconds / 60:.1f} minutes, "
        f"revision {revision}) on {machine}, and merged here: the other sections' figures are from the runs their "
        "own notes and the machine table name._"
    )


def render(sections: list[Section], info: dict[str, str], seconds: float, quick: bool) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        "# flowllm benchmarks",
        "",
        f"Written by `python -m benchmarks` on {now} in {seconds / 60:.1f} minutes"
        + (" with **--quick sizes: smoke-test figures, not measurements**." if quick else "."),
        "Each figure is the median of several runs with its min and max, next to its reference from the same run.",
        "",
        "## Machine",
        "",
        md_table(["", ""], [[k, v] for k, v in info.items()]),
        "",
        "## Targets",
        "",
        md_table(
            ["section", "target", "wanted", "measured", ""],
            [[s.title, t.what, t.target, t.measured, t.verdict] for s in sections for t in s.targets],
        ),
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(s.markdown() for s in sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script, measures nothing")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run these sections only")
    parser.add_argument(
        "--output", type=Path, help=f"the Markdown file to write (default: {RESULTS.relative_to(BENCH_DIR.parent)})"
    )
    args = parser.parse_args(argv)
    if args.output is None:
        if args.quick:  # smoke figures would replace the measurements
            parser.error(f"--quick measures nothing: give --output, so that {RESULTS.name} keeps its figures")
        args.output = RESULTS
    sizes = Sizes.quick() if args.quick else Sizes.full()
    info = machine_info()
    print("machine:", *(f"  {k}: {v}" for k, v in info.items()), sep="\n", flush=True)
    runners = _runners()
    sections: list[Section] = []
    started = time.perf_counter()
    for name in args.only or SECTIONS:
        t0 = time.perf_counter()
        print(f"\n== {name} ...", flush=True)
        section = runners[name](sizes)
        sections.append(section)
        print(section.markdown(), flush=True)
        print(f"({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    seconds = time.perf_counter() - started
    if args.only and not args.quick and args.output.exists():  # the other sections' figures are kept
        note = merge_note(args.only, info, seconds)
        text = merge_sections(args.output.read_text(encoding="utf-8"), sections, note)
    else:
        text = render(sections, info, seconds, args.quick)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
