"""``inspect bisect`` and ``inspect scale`` on what users have besides two run folders: two jobs of one sweep
(``SWEEP/0 SWEEP/1``), the same two jobs as bundles, and a sweep given whole (refused, naming two jobs to pass);
the bisect's attribution shows in the HTML report of its forks' folder."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowllm.bundle.make import make_bundle
from flowllm.emulator.server import CAPTURE_ENV
from flowllm.inspect.cli import main as inspect_main
from flowllm.rundir.results import TaskResult
from tests.experiment.helpers import start_flowllm

# What this calls in process may start `python -m flowllm` (a bundle's replay, a bisect's forks): forked.
pytestmark = pytest.mark.usefixtures("forked_python")

IDS = ("sample-02-word-count", "sample-09-arithmetic")  # max_turns=1 breaks sample-02 (it needs three turns)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two jobs that differ in max_turns; both run with repair=none, which a fork of job 0 must keep."""
    root = tmp_path_factory.mktemp("bisect-sweep")
    log = root / "sweep.log"
    args = ("-m", f"dataset.task_ids=[{','.join(IDS)}]", "repair=none", "agent.max_turns=8,1", "progress=false")
    args += ("~tools.servers.tool-files",)  # the two tasks use math and Python only
    proc = start_flowllm(*args, f"hydra.sweep.dir={root / 'sweep'}", log=log)
    assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    return root / "sweep"


def bisect_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert inspect_main(["bisect", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    return {k: v for key, inner in value.items() for k, v in flat(inner, f"{prefix}.{key}" if prefix else key).items()}


def test_two_jobs_of_a_sweep_are_planned_and_a_whole_sweep_is_refused(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    out = tmp_path / "forks"
    plan = bisect_json(capsys, str(sweep / "0"), str(sweep / "1"), "--out", str(out), "--dry-run")
    assert plan["settings_forked"] == [{"setting": "agent.max_turns", "overrides": ["agent.max_turns=1"]}]
    assert plan["differing_tasks"] == ["sample-02-word-count"] and plan["sampled_tasks"] == ["sample-09-arithmetic"]
    assert plan["observed"] == pytest.approx(-0.5) and plan["settings_left_out"] == [] and not out.exists()
    assert inspect_main(["bisect", str(sweep), str(sweep / "1"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists()
    assert err.endswith(
        f"is a sweep of 2 runs (0, 1): bisect compares two runs; pass two of its jobs, e.g. {sweep / '0'} {sweep / '1'}"
    )
    assert inspect_main(["scale", str(sweep), "--json"]) == 0  # scale reads a sweep's jobs
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["label"].split("/")[-1] for r in runs] == ["0", "1"]
    assert [r["curves"]["mean@k"]["1"]["value"] for r in runs] == [1.0, 0.5]


def test_bundles_of_two_jobs_are_bisected_by_real_forks_and_shown_in_the_report(
    sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundles = [tmp_path / "a.bundle", tmp_path / "b.bundle"]
    for job, bundle in zip(("0", "1"), bundles, strict=True):
        make_bundle(sweep / job, bundle)
    capture = tmp_path / "requests.jsonl"
    monkeypatch.setenv(CAPTURE_ENV, str(capture))  # the fork's emulator logs every request it answers
    out = tmp_path / "forks"
    data = bisect_json(capsys, *map(str, bundles), "--out", str(out))
    assert (data["a"], data["b"]) == tuple(map(str, bundles))
    assert data["observed"] == pytest.approx(-0.5)
    [effect] = data["effects"]
    assert (effect["setting"], effect["overrides"], effect["broken"]) == ("agent.max_turns", ["agent.max_turns=1"], 1)
    assert effect["effect"] == pytest.approx(-0.5) and data["interaction"] == pytest.approx(0.0)
    # Live calls: the forked turns only (from each task's fork turn to its last), as the emulator counted them.
    fork = Path(data["forks"]["agent.max_turns"])
    results = [TaskResult.from_dict(json.loads((fork / "tasks" / t / "result.json").read_text())) for t in IDS]
    turns = {
        r.task_id: r.turns - r.replay["turn"] + 1 if r.replay["status"] == "forked" else 0 for r in results if r.replay
    }
    requests = Counter(json.loads(line)["task"] for line in capture.read_text().splitlines())
    assert requests == Counter(turns) and sum(turns.values()) == data["spent"]["live_calls"] > 0
    saved_calls = sum(1 for line in (sweep / "0" / "usage.jsonl").read_text().splitlines() if '"attempt"' in line)
    assert sum(requests.values()) < saved_calls
    # The fork is job 0 with max_turns changed and nothing else: it kept the sweep's repair=none.
    config_a, config_fork = (
        flat(yaml.safe_load((r / ".hydra" / "config.yaml").read_text())) for r in (sweep / "0", fork)
    )
    differ = {k for k in set(config_a) | set(config_fork) if config_a.get(k) != config_fork.get(k)}
    assert config_fork["repair.name"] == "none"
    assert {k for k in differ if not k.startswith(("provider.", "dataset.task_ids"))} == {"agent.max_turns"}
    # The report of the forks' folder shows the attribution above them.
    assert json.loads((out / "bisect.json").read_text())["effects"] == data["effects"]
    assert inspect_main(["report", str(out), "-o", str(tmp_path / "report.html")]) == 0
    html = (tmp_path / "report.html").read_text()
    page = json.loads(html.split('id="report-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    [row] = page["bisect"]["rows"]
    assert row[:3] == ["agent.max_turns", "agent.max_turns=1", "-50.0"] and row[-1] == "0 / 1"
    assert "observed B - A -50.0 points" in page["bisect"]["note"] and "bisectCard(DATA.bisect)" in html
    assert [run["label"] for run in page["runs"]] == ["agent.max_turns"]  # the fork, in detail below the card
