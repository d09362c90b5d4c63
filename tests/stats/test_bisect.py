"""``flowllm inspect bisect A B`` on two sample runs that differ in repair and in max_turns: each setting gets
its effect (repair=none breaks sample-06, max_turns=1 breaks sample-02), effects plus interaction equal the
observed difference, and the emulator answers only the forked turns; over ``--max-cost`` nothing runs."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from flowllm.emulator.server import CAPTURE_ENV
from flowllm.inspect.cli import main as inspect_main
from flowllm.verify import audit_run
from tests.experiment.helpers import start_flowllm

# What this calls in process may start `python -m flowllm` (a bundle's replay, a bisect's forks): forked.
pytestmark = pytest.mark.usefixtures("forked_python")

IDS = ("sample-02-word-count", "sample-06-fibonacci", "sample-09-arithmetic")
TASKS = f"dataset.task_ids=[{','.join(IDS)}]"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bisect")
    procs = []
    for name, extra in (("a", ()), ("b", ("repair=none", "agent.max_turns=1"))):  # both at once
        log = root / f"{name}.log"
        procs.append((start_flowllm(TASKS, *extra, "progress=false", f"hydra.run.dir={root / name}", log=log), log))
    for proc, log in procs:
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    return root / "a", root / "b"


def test_bisect_attributes_the_difference_to_each_setting(
    runs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:

    a, b = runs
    capture = tmp_path / "requests.jsonl"
    monkeypatch.setenv(CAPTURE_ENV, str(capture))  # the forks' emulators log every request they answer
    assert inspect_main(["bisect", str(a), str(b), "--out", str(tmp_path / "forks"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["differing_tasks"] == ["sample-02-word-count", "sample-06-fibonacci"]
    assert data["sampled_tasks"] == ["sample-09-arithmetic"]
    assert data["observed"] == pytest.approx(-2 / 3)
    effects = {e["setting"]: e for e in data["effects"]}
    assert set(effects) == {"repair", "agent.max_turns"}
    assert effects["repair"]["overrides"] == ["repair=none"]
    assert effects["agent.max_turns"]["overrides"] == ["agent.max_turns=1"]
    assert effects["repair"]["effect"] == pytest.approx(-1 / 3)  # sample-06 breaks without repair
    assert effects["agent.max_turns"]["effect"] == pytest.approx(-1 / 3)  # sample-02 needs three turns
    assert (effects["repair"]["broken"], effects["agent.max_turns"]["broken"]) == (1, 1)
    assert all(e["p_holm"] is not None and e["ci"][0] <= e["effect"] <= e["ci"][1] for e in effects.values())
    total = sum(e["effect"] for e in effects.values()) + data["interaction"]
    assert total == pytest.approx(data["observed"])
    assert data["interaction"] == pytest.approx(0.0)
    # Live calls: only the forked turns, as the emulator counted them, per task.
    requests = Counter(json.loads(line)["task"] for line in capture.read_text().splitlines())
    forked: Counter[str] = Counter()
    for fork in data["forks"].values():
        for task in IDS:
            replay = json.loads((Path(fork) / "tasks" / task / "result.json").read_text())["replay"]
            forked[task] += replay.get("live_calls") or 0
            assert replay["status"] in ("exact", "forked")
    assert requests == forked and data["spent"]["live_calls"] == sum(forked.values())
    saved_calls = sum(1 for line in (a / "usage.jsonl").read_text().splitlines() if '"attempt"' in line)
    assert sum(forked.values()) < 2 * saved_calls  # two full live re-runs would have made every call again
    # Every fork the bisect made is a run folder like any other: the run auditor checks its numbers.
    for fork in data["forks"].values():
        audit = audit_run(Path(fork))
        assert audit.verified, [finding.line() for finding in audit.findings]


def test_bisect_over_max_cost_runs_nothing(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = runs
    out = tmp_path / "forks"
    assert inspect_main(["bisect", str(a), str(b), "--out", str(out), "--max-cost", "0.000001"]) == 2
    err = capsys.readouterr().err
    assert "the forks would cost $" in err and "over --max-cost" in err and "nothing ran" in err
    assert not out.exists()


def test_a_dataset_change_is_named_and_left_out(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = runs
    other = tmp_path / "b"
    shutil.copytree(b, other)
    fingerprint = json.loads((other / "fingerprint.json").read_text())
    fingerprint["settings"]["dataset.limit"] = 2
    fingerprint["dataset_files"]["metadata.jsonl"] = "0" * 64
    (other / "fingerprint.json").write_text(json.dumps(fingerprint))
    out = tmp_path / "forks"
    assert inspect_main(["bisect", str(a), str(other), "--out", str(out), "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings_left_out"] == ["dataset files", "dataset.limit"]
    assert data["effects"] == [] and data["projected_cost_usd"] > 0 and not out.exists()
    assert inspect_main(["bisect", str(a), str(other), "--out", str(out), "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "not changed by a fork (left out): dataset files, dataset.limit" in shown
