"""A run made before the package moves, the typed records and the config loader (flowllm at f528059) still
replays with today's code: every task replays exactly, gives the answers it gave then, and the replay verifies."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from flowllm.exit_codes import ExitCode
from flowllm.rundir.layout import RunLayout
from flowllm.rundir.results import RunSummary, TaskResult
from flowllm.verify.cli import main as verify_main
from tests.experiment.helpers import run_flowllm


def answers(run: Path) -> dict[str, str | None]:
    found = {}
    for path in sorted((run / "tasks").glob("*/result.json")):
        result = TaskResult.from_dict(orjson.loads(path.read_bytes()))
        found[result.task_id] = result.answer
    return found


def test_an_old_run_replays_exactly_and_verifies(
    old_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = old_runs / "plain"
    again = tmp_path / "again"
    proc = run_flowllm("provider=replay", f"provider.run_dir={saved}", f"hydra.run.dir={again}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = RunSummary.from_dict(orjson.loads(RunLayout(again).summary.read_bytes()))
    old = answers(saved)
    assert summary.replay is not None
    assert (summary.replay.exact, summary.replay.diverged, summary.replay.missing) == (len(old), 0, 0)
    assert summary.replay.live_calls == 0
    assert answers(again) == old
    assert verify_main([str(again)]) == ExitCode.OK, capsys.readouterr().out
