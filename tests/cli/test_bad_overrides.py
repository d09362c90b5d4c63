"""Every bad setting of every config group exits 2 with one line and no traceback, through the real command line.

The rows (tests/cli/bad_overrides.py) fail before any task starts; they run as parallel processes.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flowllm.config.check import check_command_line
from tests.appfork import run_app
from tests.cli.bad_overrides import BAD_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]


def _run(args: tuple[str, ...], run_dir: Path) -> subprocess.CompletedProcess[str]:
    # Rows about other settings skip starting the tool servers (the slowest check), to keep the table quick.
    quick = [] if any(a.startswith("tools") for a in args) else ["preflight.tools=false"]
    return run_app(
        ["progress=false", f"hydra.run.dir={run_dir}", *quick, *args], cwd=ROOT, timeout=300, env=dict(os.environ)
    )


def test_every_bad_override_exits_2_with_one_line(tmp_path: Path) -> None:
    workers = max(2, min(8, (os.cpu_count() or 2) * 2))
    with ThreadPoolExecutor(workers) as pool:
        done = [pool.submit(_run, args, tmp_path / str(i)) for i, (args, _) in enumerate(BAD_OVERRIDES)]
    wrong = []
    for (args, fragment), future in zip(BAD_OVERRIDES, done, strict=True):
        proc = future.result()
        lines = proc.stderr.strip().splitlines()
        one_line = len(lines) == 1 and lines[0].startswith("flowllm: error: ")
        if proc.returncode != 2 or not one_line or fragment not in lines[0]:
            wrong.append(f"{' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-800:]}")
        # nothing ran: no task folder was made
        assert not (tmp_path / str(BAD_OVERRIDES.index((args, fragment))) / "tasks").exists(), args
    assert not wrong, "\n\n".join(wrong)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-m", "provider=offline,claud"], "did you mean claude"),  # every swept value is checked
        (["+provider.extra_body.top_k=3"], None),  # a free-form mapping takes any key
        (["++provider.emulator_faults={seed: 3}"], None),  # and is set whole with ++
        (["+experiment=gaia"], None),
        (["--help", "provider=claud"], None),  # Hydra answers --help itself
    ],
)
def test_sweeps_and_free_form_keys(argv: list[str], expected: str | None) -> None:
    problems = check_command_line(argv)
    if expected is None:
        assert problems == []
    else:
        assert len(problems) == 1 and expected in problems[0]
