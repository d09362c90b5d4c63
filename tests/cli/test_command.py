"""The ``flowllm`` console command: run, inspect and list from one entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flowllm.cli.command import main
from flowllm.cli.listing import group_options, help_text

ROOT = Path(__file__).resolve().parents[2]


def test_list_shows_choices_without_schemas(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "providers"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert "claude" in names and "offline" in names and "local" in names
    assert not [n for n in names if n.startswith("base_")]
    for what in ("experiments", "tools", "pipelines", "repair"):
        assert main(["list", what]) == 0
    assert "gaia" in group_options("experiment") and "strict" in group_options("repair")
    assert main(["list", "nothing"]) == 2


def test_experiments_are_described_by_their_comment_not_by_the_package_directive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["list", "experiments"]) == 0
    out = capsys.readouterr().out
    assert "@package" not in out
    line = next(line for line in out.splitlines() if line.split()[:1] == ["web_sample"])
    assert "The GAIA web tools offline" in line


def test_help_lists_groups_and_exit_codes() -> None:
    text = help_text()
    assert "provider=" in text and "base_provider" not in text and "exit codes" in text


def test_inspect_and_run_through_the_console_command(tmp_path: Path) -> None:
    # `flowllm inspect` is python -m flowllm.inspect: a folder that is not a run exits 2 with one line.
    done = subprocess.run(
        [sys.executable, "-m", "flowllm.cli.command", "inspect", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    # `flowllm run` is python -m flowllm: the same config check and exit code.
    done = subprocess.run(
        [sys.executable, "-m", "flowllm.cli.command", "run", "provider=claud"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "did you mean claude" in done.stderr


def test_a_server_added_on_the_command_line_may_name_the_task_folder(tmp_path: Path) -> None:
    # ${workspace} in a +tools.servers override is the task's folder, substituted when the server starts: the
    # config checks must not resolve it (they once failed with "Interpolation key 'workspace' not found").
    server = '+tools.servers.echo={command: python, args: [-c, "import sys", "${workspace}"]}'
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowllm",
            "tools=none",
            server,
            "preflight.tools=false",
            "dataset.task_ids=[sample-01-csv-revenue]",
            "progress=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Interpolation" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    # The run went past the config checks to the task (the stand-in server is no MCP server: it is reported).
    assert (tmp_path / "run" / "tasks" / "sample-01-csv-revenue" / "result.json").exists(), done.stderr
