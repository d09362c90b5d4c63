"""The manual's other commands are executed too: every ``flowllm inspect|verify|sweep-summary|list ...`` line the
README and the documentation pages show (also spelled ``python -m flowllm.inspect``, ``python -m flowllm verify``,
``python -m flowllm.sweep.summary``) is parsed by the command's own argument parser as written (its subcommands,
options and choices exist), ``flowllm list ...`` lists, and the ``flowllm verify`` lines that need no file of the
reader's are run on the offline sample, which they must find verified (exit 0); a line naming a run in an object
store (``s3://...``) finds the sample there, put on a real S3 server. The run commands:
tests/test_readme_commands.py.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flowllm.cli.command import main
from flowllm.exit_codes import ExitCode
from tests.experiment.s3_server import S3Server
from tests.manual import manual_lines

# The spellings of each command, and what the flowllm console script is given for it.
SPELLINGS = {
    "flowllm inspect": ("inspect",),
    "python -m flowllm.inspect": ("inspect",),
    "flowllm verify": ("verify",),
    "python -m flowllm verify": ("verify",),
    "flowllm sweep-summary": ("sweep-summary",),
    "python -m flowllm.sweep.summary": ("sweep-summary",),
    "flowllm list": ("list",),
    "flowllm bundle": ("bundle",),
}
TOOL = re.compile(
    r"(?:^|`|# or )\s*(" + "|".join(re.escape(s) for s in sorted(SPELLINGS, key=len, reverse=True)) + r")(?= |$|`)"
    r"([^`\n#;]*)"
)
PLACEHOLDER = re.compile(r"<[^>]+>")  # <multirun dir>: one argument
# Words the manual uses for a run folder the reader has: the test gives it the offline sample.
RUN_WORDS = {"RUN", "runs/first-sweep", "runs/2026-12-02/10-00-00", "runs/2026-12-04/10-00-00"}


@dataclass(frozen=True)
class ToolCommand:
    page: str
    line: int
    text: str
    argv: tuple[str, ...]


def manual_tool_commands() -> list[ToolCommand]:
    found: dict[tuple[str, ...], ToolCommand] = {}
    for page, number, line in manual_lines():
        for match in TOOL.finditer(line):
            rest = PLACEHOLDER.sub("DIR", match.group(2))
            args = tuple(a for a in shlex.split(rest) if a not in ("&&", "|"))
            if not args or "..." in args:
                continue  # a usage line, not a command
            argv = (*SPELLINGS[match.group(1)], *args)
            found.setdefault(argv, ToolCommand(page, number, f"{match.group(1)}{match.group(2)}".strip(), argv))
    return list(found.values())


COMMANDS = manual_tool_commands()


class Parsed(Exception):
    """Raised once the command's parser accepted its arguments: nothing past parsing runs."""


def parse_only(argv: Sequence[str]) -> None:
    original = argparse.ArgumentParser.parse_known_args

    def accept(parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        original(parser, *args, **kwargs)  # an argparse error exits 2 here
        raise Parsed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", accept)
        with pytest.raises(Parsed):
            main(list(argv))


def test_the_manual_shows_these_commands() -> None:
    verbs = {c.argv[:2] for c in COMMANDS}
    assert {("inspect", "diff"), ("inspect", "power"), ("inspect", "export"), ("verify", "RUN")} <= verbs
    assert any(c.argv[0] == "sweep-summary" for c in COMMANDS)
    assert ("list", "providers") in verbs


PARSED = [c for c in COMMANDS if c.argv[0] != "list"]
LISTINGS = [c for c in COMMANDS if c.argv[0] == "list"]


@pytest.mark.parametrize("command", PARSED, ids=[f"{c.page}:{c.line}" for c in PARSED])
def test_every_manual_tool_command_parses(command: ToolCommand) -> None:
    parse_only(command.argv)


@pytest.mark.parametrize("command", LISTINGS, ids=[f"{c.page}:{c.line}" for c in LISTINGS])
def test_every_manual_listing_lists(command: ToolCommand, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(list(command.argv)) == ExitCode.OK
    assert capsys.readouterr().out.strip()


BUNDLE_FILES = (".tar.zst", ".tar.gz")  # flowllm verify FILE checks a bundle (tests/bundle), not the sample
AUDITS = [
    c
    for c in COMMANDS
    if c.argv[0] == "verify" and "--export" not in c.argv and not any(a.endswith(BUNDLE_FILES) for a in c.argv)
]


def stored_sample(url: str, sample_run: Path, s3: S3Server) -> None:
    """The sample run put at ``url`` (``s3://bucket/prefix``) on the test's S3 server, its bucket made if new."""
    fs = s3.fs()
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    files = [f for f in sample_run.rglob("*") if f.is_file()]
    fs.pipe({f"{url}/{f.relative_to(sample_run).as_posix()}": f.read_bytes() for f in files})


@pytest.mark.parametrize("command", AUDITS, ids=[f"{c.page}:{c.line}" for c in AUDITS])
def test_every_manual_verify_command_verifies_the_sample(
    command: ToolCommand,
    sample_run: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    argv = [str(sample_run) if a in RUN_WORDS else a for a in command.argv]
    for url in (a for a in argv if a.startswith("s3://")):
        s3: S3Server = request.getfixturevalue("s3")
        stored_sample(url, sample_run, s3)
        for name, value in {**s3.env(), "FLOWLLM_STORE_CACHE": str(tmp_path / "cache")}.items():
            monkeypatch.setenv(name, value)
    assert main(argv) == ExitCode.OK, capsys.readouterr().out[-3000:]
    assert "verified" in capsys.readouterr().out
