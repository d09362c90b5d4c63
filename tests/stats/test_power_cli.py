"""``python -m flowllm.inspect power``: the sample size printed and in JSON, and one-line refusals (exit 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flowllm.inspect.cli import main


def test_power_prints_tasks_and_epochs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["power", "--baseline", "0.5", "--delta", "0.1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["tasks"] == 385 and plan["epochs"] == 1 and plan["cost_per_run_usd"] is None
    assert main(["power", "--baseline", "0.5", "--delta", "0.1", "--epochs", "4", "--within-var", "0.2"]) == 0
    out = capsys.readouterr().out
    expected = math.ceil((1.959964 + 0.841621) ** 2 * (0.10 + 0.09) / 0.01)
    assert f"{expected:,} x 4 = {4 * expected:,} task-epochs per run" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--baseline", "1.5", "--delta", "0.05"], "the baseline accuracy must be between 0 and 1, not 1.5"),
        (["--delta", "0.05"], "give --baseline"),
        (["--baseline", "0.6", "--delta", "0.05", "--epochs", "0"], "epochs must be at least 1, not 0"),
        (["--run", "nowhere", "--delta", "0.05"], "has no summary.json"),
    ],
)
def test_bad_power_input_is_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["power", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
