"""Throughput of flowllm's parsing stage next to the json_repair and json5 libraries, in one run.

    python benchmarks/parsing.py [--min-time 0.3]

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
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flowllm.parsing import parse_tool_calls, repair_arguments, repair_json  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds spent timing each cell")
    args = ap.parse_args(argv)

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
