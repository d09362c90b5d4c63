"""``flowllm inspect scale``: every figure of ``--json`` on a 5-epoch run of the offline sample whose emulator
script varies answers across epochs equals a brute-force computation here (majority over the epochs' subsets,
pass@k by enumerating subsets, cost from the ledger, the seeded bootstrap); a cascade over two saved runs equals
a hand computation; runs over different tasks use the common ones; k beyond the epochs is refused."""

from __future__ import annotations

import json
import math
import shutil
import tarfile
from collections import Counter
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zstandard

from flowllm.bundle.make import make_bundle
from flowllm.emulator.server import CAPTURE_ENV
from flowllm.inspect.cli import main as inspect_main
from flowllm.rundir.results import TaskResult
from tests.experiment.helpers import ROOT, start_flowllm

IDS = ("sample-03-percentage", "sample-07-department", "sample-09-arithmetic")
TASKS = f"dataset.task_ids=[{','.join(IDS)}]"
# Epoch n of a task answers from "<task>#<n>" when the script has it: sample-09 answers right, 124, 124, right,
# 123 (a tie of two answers at k=4), sample-03 right, 7, right, right, right; sample-07 is always right.
VARIED = {
    "sample-09-arithmetic#2": [{"text": "\\boxed{124}"}],
    "sample-09-arithmetic#3": [{"text": "\\boxed{124}"}],
    "sample-09-arithmetic#5": [{"text": "\\boxed{123}"}],
    "sample-03-percentage#2": [{"text": "\\boxed{7}"}],
}


# Each task's first call in the five-epoch run is answered empty, then retried: the provider billed the empty
# reply, so the cost of the epochs counts it.
EMPTY_FIRST_CALLS = (
    "+provider.emulator_faults={seed: 3, rules: [{fault: empty, turns: [1], attempts: [1]}]}",
    "provider.retry.base_delay_s=0.01",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scale")
    script = yaml.safe_load((ROOT / "flowllm/data/sample/script.yaml").read_text())
    script["tasks"].update(VARIED)
    (root / "script.yaml").write_text(yaml.safe_dump(script))
    out, procs = {}, []
    for name, epochs in (("five", 5), ("three", 3)):  # both at once: each waits on its emulator and tools
        out[name] = root / name
        args = (f"experiment.epochs={epochs}", TASKS, f"provider.emulator_script={root / 'script.yaml'}")
        args += EMPTY_FIRST_CALLS if name == "five" else ()
        # the three tasks use math and Python only
        extra = ("progress=false", "~tools.servers.tool-files", f"hydra.run.dir={out[name]}")
        procs.append((start_flowllm(*args, *extra, log=root / f"{name}.log"), root / f"{name}.log"))
    for proc, log in procs:
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    return out


def scale_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert inspect_main(["scale", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def epochs_of(run: Path, task: str) -> list[tuple[str, bool]]:
    """(answer, correct) of each epoch, from the epochs' own result.json files."""
    folders = sorted((run / "tasks" / task / "epochs").iterdir(), key=lambda p: int(p.name))
    results = [json.loads((f / "result.json").read_text()) for f in folders]
    return [(r["answer"].strip(), r["correct"]) for r in results]


def ledger_cost(run: Path, task: str) -> float:
    """What the provider billed for the task: every attempt's cost (a refused one costs nothing)."""
    lines = [json.loads(line) for line in (run / "usage.jsonl").read_text().splitlines()]
    return sum(x["cost_usd"] for x in lines if x["type"] == "attempt" and x["task_id"] == task)


def majority(subset: tuple[tuple[str, bool], ...]) -> bool:
    counts = Counter(a for a, _ in subset)
    best = max(counts.values())
    return next(ok for a, ok in subset if counts[a] == best)  # a tie: the tied answer of the earliest epoch


BRUTE = {
    "majority@k": majority,
    "pass@k": lambda s: any(ok for _, ok in s),
    "pass^k": lambda s: all(ok for _, ok in s),
    "mean@k": lambda s: sum(ok for _, ok in s) / len(s),
}


def bootstrap(values: list[float]) -> list[float]:
    rng = np.random.default_rng(0)
    data = np.asarray(values)
    means = data[rng.integers(0, len(data), size=(2000, len(data)))].mean(axis=1)
    return [float(x) for x in np.percentile(means, [2.5, 97.5])]


def test_every_figure_equals_a_brute_force_computation(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs["five"]
    data = scale_json(capsys, str(run))
    assert data["interval"] == {
        "method": "percentile bootstrap over tasks",
        "resamples": 2000,
        "seed": 0,
        "confidence": 0.95,
    }
    assert data["task_ids"] == list(IDS) and data["left_out"] == {}
    (curves,) = data["runs"]
    assert curves["epochs"] == 5
    epochs = {t: epochs_of(run, t) for t in IDS}
    assert [ok for _, ok in epochs["sample-09-arithmetic"]] == [True, False, False, True, False]  # the script varied
    costs = {t: ledger_cost(run, t) for t in IDS}
    for name, judge in BRUTE.items():
        for k in range(1, 6):
            per_task = [sum(judge(s) for s in combinations(epochs[t], k)) / math.comb(5, k) for t in IDS]
            point = curves["curves"][name][str(k)]
            assert point["value"] == pytest.approx(sum(per_task) / 3), (name, k)
            assert point["ci"] == pytest.approx(bootstrap(per_task)), (name, k)
            assert point["n"] == 3
            assert point["cost_per_task_usd"] == pytest.approx(sum(k * costs[t] / 5 for t in IDS) / 3)
    # Every epoch's cost is the bill's: all five epochs of the three tasks cost what the run's summary says, the
    # empty replies that were paid for and retried among them.
    lines = [json.loads(line) for line in (run / "usage.jsonl").read_text().splitlines()]
    assert sum(1 for x in lines if x["type"] == "attempt" and x["outcome"] != "ok" and x["cost_usd"] > 0) == 3
    agent_usd = json.loads((run / "summary.json").read_text())["cost"]["agent_usd"]
    assert 3 * curves["curves"]["mean@k"]["5"]["cost_per_task_usd"] == pytest.approx(agent_usd)
    # the figures the sample makes interesting: majority@5 fixes sample-09, pass^k falls with k
    assert curves["curves"]["majority@k"]["5"]["value"] == 1.0
    assert curves["curves"]["pass^k"]["5"]["value"] == pytest.approx(1 / 3)
    # The HTML report of a run with epochs shows the same figures, one row per k.
    assert inspect_main(["report", str(run), "-o", str(tmp_path / "report.html")]) == 0
    html = (tmp_path / "report.html").read_text()
    assert "Test-time scaling (from saved epochs)" in html and '"majority@k","pass@k","pass^k","mean@k"' in html
    assert '["5","100.0% [100.0, 100.0]","100.0% [100.0, 100.0]","33.3% [0.0, 100.0]"' in html


def test_a_cascade_equals_a_hand_computation(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    five, three = runs["five"], runs["three"]
    for threshold in (0.8, 0.6):
        data = scale_json(capsys, str(five), str(three), "--agreement", str(threshold))
        cascade = data["cascade"]
        assert cascade["order"] == ["three", "five"]  # the cheaper run (3 epochs) answers first
        right, spent, by = [], [], Counter()
        for task in IDS:
            cost = 0.0
            for run in (three, five):
                answers = epochs_of(run, task)
                cost += ledger_cost(run, task)
                top = Counter(a for a, _ in answers).most_common(1)[0][1]
                if top / len(answers) >= threshold or run == five:
                    right.append(majority(tuple(answers)))
                    by[run.name] += 1
                    break
            spent.append(cost)
        assert cascade["value"] == pytest.approx(sum(right) / 3)
        assert cascade["cost_per_task_usd"] == pytest.approx(sum(spent) / 3)
        assert cascade["answered_by"] == {"three": by["three"], "five": by["five"]}
    # at 0.6 the cheap run's 2-of-3 majority on sample-09 (124) is kept: wrong; at 0.8 it escalates: right
    assert cascade["value"] == pytest.approx(2 / 3)


def test_different_tasks_and_too_large_k(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    for task, ok in (("sample-03-percentage", True), ("elsewhere-01", False)):
        (other / "tasks" / task).mkdir(parents=True)
        result = TaskResult(task_id=task, status="completed", answer="1", correct=ok)
        (other / "tasks" / task / "result.json").write_text(json.dumps(result.to_dict()))
    # A task whose answer could not be scored (the judge failed) is left out, and said to be.
    (other / "tasks" / "judged").mkdir(parents=True)
    failed = TaskResult(task_id="judged", status="completed", answer="1", correct=None, score_error="no verdict")
    (other / "tasks" / "judged" / "result.json").write_text(json.dumps(failed.to_dict()))
    assert inspect_main(["scale", str(runs["five"]), str(other)]) == 0
    assert "left out (no scored epoch), other: judged" in capsys.readouterr().out
    data = scale_json(capsys, str(runs["five"]), str(other))
    assert data["unscored"] == {"other": ["judged"]}
    assert data["task_ids"] == ["sample-03-percentage"]
    assert data["left_out"] == {
        "five": ["sample-07-department", "sample-09-arithmetic"],
        "other": ["elsewhere-01"],
    }
    lone = tmp_path / "lone"
    (lone / "tasks" / "elsewhere-01").mkdir(parents=True)
    (lone / "tasks" / "elsewhere-01" / "result.json").write_text(
        (other / "tasks" / "elsewhere-01" / "result.json").read_text()
    )
    assert inspect_main(["scale", str(runs["five"]), str(lone)]) == 2
    assert "no scored task in common" in capsys.readouterr().err
    assert inspect_main(["scale", str(runs["five"]), "--k", "6"]) == 2
    assert capsys.readouterr().err.strip().endswith("k=6 is more than the epochs run: the largest k is 5")


def test_best_of_k_by_a_judge_is_recorded_and_replayed(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "five"
    shutil.copytree(runs["five"], run)
    # The judge picks the first candidate, except on sample-09 where it picks the second (124: wrong).
    judge = {"default": ["\\boxed{1}"], "tasks": {"sample-09-arithmetic/rerank": ["\\boxed{2}"] * 5}}
    (tmp_path / "judge.yaml").write_text(yaml.safe_dump(judge))
    capture = tmp_path / "requests.jsonl"
    monkeypatch.setenv(CAPTURE_ENV, str(capture))
    args = (str(run), "--judge", "offline", "--judge-script", str(tmp_path / "judge.yaml"))
    first = scale_json(capsys, *args)
    # sample-07's epochs all agree (no call); sample-03 and sample-09 have two or more answers for every k >= 2
    assert first["best_of_k"]["five"]["calls"] == 8 and first["best_of_k"]["five"]["replayed"] == 0
    assert len(capture.read_text().splitlines()) == 8
    lines = [json.loads(x) for x in (run / "rerank_usage.jsonl").read_text().splitlines()]
    judged: Counter[tuple[str, int]] = Counter()
    for line in lines:
        if line["type"] == "attempt" and line["outcome"] == "ok":
            judged[(line["task_id"], line["turn"])] += line["cost_usd"]
    best = first["runs"][0]["curves"]["best-of-k"]
    assert set(best) == {"2", "3", "4", "5"}
    for k in range(2, 6):
        assert best[str(k)]["value"] == pytest.approx(2 / 3)
        cost = sum(k * ledger_cost(run, t) / 5 + judged[(t, k)] for t in IDS) / 3
        assert best[str(k)]["cost_per_task_usd"] == pytest.approx(cost)
    assert (run / "tasks/sample-09-arithmetic/judge/rerank/k02/verdict.json").is_file()
    again = scale_json(capsys, *args)  # the recorded judge calls are read back: nothing is asked again
    assert again["best_of_k"]["five"]["calls"] == 0 and again["best_of_k"]["five"]["replayed"] == 8
    assert len(capture.read_text().splitlines()) == 8
    assert again["runs"][0]["curves"]["best-of-k"] == best


def test_a_bundle_gives_the_figures_of_its_run_and_an_edited_one_is_refused(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "five.tar.zst"
    make_bundle(runs["five"], bundle)
    from_folder = scale_json(capsys, str(runs["five"]))
    from_bundle = scale_json(capsys, str(bundle))
    assert from_bundle["runs"][0]["curves"] == from_folder["runs"][0]["curves"]
    assert from_bundle["runs"][0]["label"] == bundle.name
    # One result.json edited inside the archive (re-packed with the old manifest): refused, naming the file.
    unpacked = tmp_path / "unpacked"
    with (
        bundle.open("rb") as handle,
        zstandard.ZstdDecompressor().stream_reader(handle) as stream,
        tarfile.open(fileobj=stream, mode="r|") as tar,
    ):
        tar.extractall(unpacked, filter="data")
    result = next(unpacked.glob("runs/*/tasks/sample-09-arithmetic/result.json"))
    result.write_bytes(result.read_bytes().replace(b'"correct": false', b'"correct": true', 1) + b" ")
    edited = tmp_path / "edited.tar.zst"
    with (
        edited.open("wb") as handle,
        zstandard.ZstdCompressor().stream_writer(handle) as stream,
        tarfile.open(fileobj=stream, mode="w|") as tar,
    ):
        for path in sorted(p for p in unpacked.rglob("*") if p.is_file()):
            tar.add(path, arcname=path.relative_to(unpacked).as_posix())
    assert inspect_main(["scale", str(edited)]) == 2
    assert "result.json: its SHA-256 differs" in capsys.readouterr().err
