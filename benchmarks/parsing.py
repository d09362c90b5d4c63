"""Throughput of flowllm's parsing stage next to the json_repair and json5 libraries, in one run; and its
growth on hostile input.

    python benchmarks/parsing.py [--min-time 0.3]
    python benchmarks/parsing.py --adversarial [--sizes 10000 100000 1000000]

Workloads (all read from tests/corpora, relative to this file):

* ``json_repair corpus``: the 267 broken-JSON inputs of json_repair's own test suite;
* ``tool-call corpus``: the 136 model replies of vLLM's/SGLang's tool-parser tests plus MiroFlow's examples.
  flowllm runs ``parse_tool_calls`` and then ``repair_arguments`` on every call found; the libraries, which
  cannot read tool-call formats, are timed on the same replies (their best effort: the JSON in the text) and
  on the argument texts flowllm extracted (mostly valid JSON: there all three are a json.loads);
* ``clean``: every expected value of both corpora serialised with ``json.dumps``: valid JSON, where the only
  question is what the fast path costs next to a bare ``json.loads``.

Each cell is the best of several timed passes over the whole workload (cases/s and MB/s of UTF-8 input).
The targets of issue 4: at least 5x json_repair on the corpora, and within 1.2x of ``json.loads`` on clean input.

``--adversarial`` times each hostile shape of ``HOSTILE`` (replies written to make a parser go quadratic or
raise) at 10 KB, 100 KB and 1 MB and prints the growth per 10x of input: about 10x is linear, 100x quadratic.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flowllm.parsing import (  # noqa: E402
    StreamingToolCallParser,
    parse_tool_calls,
    repair_arguments,
    repair_json,
)

try:  # dev dependencies: the comparison, not the product
    import json_repair
except ImportError:  # pragma: no cover
    json_repair = None
try:
    import json5
except ImportError:  # pragma: no cover
    json5 = None

CORPORA = ROOT / "tests" / "corpora"


def _rows(name: str) -> list[dict[str, Any]]:
    with (CORPORA / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _swallow(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    def run(text: str) -> Any:
        try:
            return fn(text)
        except Exception:  # a library giving up is part of its cost, not a crash of the benchmark
            return None

    return run


def measure(fn: Callable[[str], Any], inputs: list[str], min_time: float) -> float:
    """Best seconds per pass over ``inputs``."""
    fn(inputs[0])
    best = float("inf")
    spent = 0.0
    passes = 0
    while spent < min_time or passes < 3:
        t0 = time.perf_counter()
        for text in inputs:
            fn(text)
        dt = time.perf_counter() - t0
        best = min(best, dt)
        spent += dt
        passes += 1
    return best


def _tool_call_job(texts: list[str]) -> Callable[[str], Any]:
    def run(text: str) -> Any:
        parsed = parse_tool_calls(text)
        return [repair_arguments(c.arguments_text) for c in parsed.calls]

    return run


def _fill(unit: str, size: int, head: str = "", tail: str = "") -> str:
    return head + unit * max(1, (size - len(head) - len(tail)) // len(unit)) + tail


def _stream(text: str) -> Any:
    parser = StreamingToolCallParser()
    for i in range(0, len(text), 64):  # a provider's chunks are a few tokens each
        parser.feed(text[i : i + 64])
    return parser.finish()


_PARSE, _REPAIR, _STREAM = "parse_tool_calls", "repair_arguments", "streaming, 64-char chunks"
# name -> (what runs, the text of a given size). The first five are the shapes of issue 19; the rest are the
# other ways a marker without its close, or a run of one character, made some stage scan to the end again.
HOSTILE: dict[str, tuple[str, Callable[[int], str]]] = {
    '{"name": "x", then [ x n': (_PARSE, lambda n: _fill("[", n, '{"name": "x", ')),
    "<use_mcp_tool  x n (no >)": (_PARSE, lambda n: _fill("<use_mcp_tool ", n)),
    '{"a": "{ then , "k":  x n': (_REPAIR, lambda n: _fill(', "k": ', n, '{"a": "{')),
    "backslash run in a string": (_REPAIR, lambda n: _fill("\\", n, '{"a": "')),
    "prose": (_STREAM, lambda n: _fill("The quick brown fox jumps over it. ", n)),
    "prose with brackets": (_STREAM, lambda n: _fill("So {x} and [y]. ", n)),
    "<tool_call> blocks": (_STREAM, lambda n: _fill('<tool_call>{"name": "f", "arguments": {}}</tool_call>\n', n)),
    "<tool_call>{ x n (no close)": (_PARSE, lambda n: _fill("<tool_call>{", n)),
    "<parameter=a x n (no >)": (_PARSE, lambda n: _fill("<parameter=a", n, "<function=f>")),
    "<arg_key> x n (no close)": (_PARSE, lambda n: _fill("<arg_key>", n, "<tool_call>f")),
    "[TOOL_CALLS][ x n": (_PARSE, lambda n: _fill("[TOOL_CALLS][", n)),
    "<|tool_call_begin|> x n": (_PARSE, lambda n: _fill("<|tool_call_begin|>", n)),
    '{" x n after a name key': (_PARSE, lambda n: _fill('{"', n, '"name": ')),
    "pythonic call, n keywords": (_PARSE, lambda n: _fill("a=1, ", n, "[f(", ")]")),
    "- x n in a pythonic call": (_PARSE, lambda n: _fill("-", n, "[f(a=", "1)]")),
    '" x n': (_REPAIR, lambda n: _fill('"', n, '{"a": ')),
    '{" x n': (_REPAIR, lambda n: _fill('{"', n)),
    "/* x n": (_REPAIR, lambda n: _fill("/*", n, "{")),
    "```json { x n": (_REPAIR, lambda n: _fill("```json\n{", n)),
}
_RUNS = {_PARSE: parse_tool_calls, _REPAIR: repair_arguments, _STREAM: _stream}
ADVERSARIAL_SIZES = (10_000, 100_000, 1_000_000)


def adversarial(sizes: tuple[int, ...] = ADVERSARIAL_SIZES) -> tuple[list[list[str]], float]:
    """One row per hostile shape: seconds at each size and the growth per 10x; and the worst growth."""
    rows: list[list[str]] = []
    worst = 0.0
    for name, (kind, make) in HOSTILE.items():
        fn = _RUNS[kind]
        seconds = [_best(fn, make(n)) for n in sizes]
        rows.append(_row(name, kind, seconds))
        worst = max([worst, *_readable_growth(seconds)])
    # The reference: one compiled-regex pass over a text of the same sizes, the least work any parser can do.
    reference = [_best(lambda t: list(_REFERENCE.finditer(t)), _fill("<parameter=a", n)) for n in sizes]
    rows.append(_row("reference: one regex pass, no match", "re.finditer", reference))
    return rows, worst


_REFERENCE = re.compile(r"<parameter=([^<>\n]+)>")
# Growth is read where the smaller size takes this long: below it the figure measures the memory hierarchy
# (the reference row grows like the fast rows), not the algorithm.
READABLE_S = 0.010


def _readable_growth(seconds: list[float]) -> list[float]:
    return [b / a for a, b in itertools.pairwise(seconds) if a >= READABLE_S]


def _row(name: str, kind: str, seconds: list[float]) -> list[str]:
    growth = [b / a if a > 0 else float("inf") for a, b in itertools.pairwise(seconds)]
    cells = [f"{g:.1f}x" if a >= READABLE_S else f"({g:.1f}x)" for g, a in zip(growth, seconds, strict=False)]
    return [name, kind, *(f"{t * 1e3:,.1f}" for t in seconds), *cells]


def _best(fn: Callable[[str], Any], text: str) -> float:
    """Best of three passes: on a shared machine one pass can take twice as long as the next."""
    return min(_once(fn, text) for _ in range(3))


def _once(fn: Callable[[str], Any], text: str) -> float:
    t0 = time.perf_counter()
    fn(text)
    return time.perf_counter() - t0


def _size_label(n: int) -> str:
    return f"{n // 1_000_000} MB" if n >= 1_000_000 else f"{n // 1_000} KB"


def adversarial_headers(sizes: tuple[int, ...]) -> list[str]:
    labels = [_size_label(n) for n in sizes]
    return [
        "shape",
        "run",
        *(f"{x} ms" for x in labels),
        *(f"{a}->{b}" for a, b in itertools.pairwise(labels)),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds spent timing each cell")
    ap.add_argument("--adversarial", action="store_true", help="time the hostile shapes instead of the corpora")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(ADVERSARIAL_SIZES), help="characters per shape")
    args = ap.parse_args(argv)
    if args.adversarial:
        sizes = tuple(args.sizes)
        rows, worst = adversarial(sizes)
        widths = [34, 26] + [12] * (len(rows[0]) - 2)
        print("".join(f"{h:<{w}}" for h, w in zip(adversarial_headers(sizes), widths, strict=False)))
        for row in rows:
            print("".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=False)))
        print(f"\nworst growth per 10x of input: {worst:.1f}x (linear is about 10x, quadratic 100x)")
        return 0

    jr_rows = _rows("json_repair_cases.jsonl")
    tc_rows = _rows("tool_call_cases.jsonl")
    jr_inputs = [r["input"] for r in jr_rows]
    tc_texts = [r["text"] for r in tc_rows]
    extracted = [c.arguments_text for t in tc_texts for c in parse_tool_calls(t).calls]
    clean = [json.dumps(r["expected"]) for r in jr_rows if not r["expected_empty"]]
    clean += [json.dumps(e["arguments"]) for r in tc_rows for e in r["expected"]]

    libs: dict[str, Callable[[str], Any]] = {}
    if json_repair is not None:
        libs["json_repair.loads"] = _swallow(json_repair.loads)
    if json5 is not None:
        libs["json5.loads"] = _swallow(json5.loads)

    workloads: list[tuple[str, list[str], list[tuple[str, Callable[[str], Any], list[str]]]]] = [
        (
            "json_repair corpus",
            jr_inputs,
            [("flowllm repair_json", repair_json, jr_inputs)] + [(k, f, jr_inputs) for k, f in libs.items()],
        ),
        (
            "tool-call corpus",
            tc_texts,
            [("flowllm parse_tool_calls + repair_arguments", _tool_call_job(tc_texts), tc_texts)]
            + [(f"{k} (whole reply)", f, tc_texts) for k, f in libs.items()]
            + [("flowllm repair_arguments (extracted args)", repair_arguments, extracted)]
            + [(f"{k} (extracted args)", f, extracted) for k, f in libs.items()],
        ),
        (
            "clean JSON",
            clean,
            [
                ("json.loads", json.loads, clean),
                ("flowllm repair_json", repair_json, clean),
                ("flowllm repair_arguments", repair_arguments, clean),
            ]
            + [(k, f, clean) for k, f in libs.items()],
        ),
    ]

    print(f"{'workload':<20} {'parser':<46} {'cases':>6} {'cases/s':>11} {'MB/s':>8} {'vs ref':>8}")
    print("-" * 104)
    results: dict[tuple[str, str], float] = {}
    for wname, _inputs, entries in workloads:
        ref_seconds = None
        for label, fn, inputs in entries:
            seconds = measure(fn, inputs, args.min_time)
            size = sum(len(t.encode("utf-8")) for t in inputs)
            results[(wname, label)] = seconds
            if ref_seconds is None:
                ref_seconds = seconds
            rel = f"{ref_seconds / seconds:.2f}x" if seconds else "-"
            print(
                f"{wname:<20} {label:<46} {len(inputs):>6} {len(inputs) / seconds:>11,.0f} "
                f"{size / seconds / 1e6:>8.2f} {rel:>8}"
            )
        print()

    print("targets")
    if json_repair is not None:
        jr = (
            results[("json_repair corpus", "json_repair.loads")]
            / results[("json_repair corpus", "flowllm repair_json")]
        )
        tc = (
            results[("tool-call corpus", "json_repair.loads (whole reply)")]
            / results[("tool-call corpus", "flowllm parse_tool_calls + repair_arguments")]
        )
        print(f"  json_repair corpus: flowllm is {jr:.1f}x json_repair's throughput (target >= 5x)")
        print(
            f"  tool-call corpus: flowllm (every call found and its arguments read) is {tc:.1f}x json_repair "
            "reading the same replies (target >= 5x)"
        )
    clean_ratio = results[("clean JSON", "flowllm repair_arguments")] / results[("clean JSON", "json.loads")]
    print(f"  clean JSON: repair_arguments takes {clean_ratio:.2f}x the time of json.loads (target <= 1.2x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
