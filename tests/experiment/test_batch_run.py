"""Batch mode end to end: the app against the emulator, batched and direct, and a batched run killed and resumed.

The killed run talks to an emulator started here (not by the run), so the batches it submitted outlive it, as a
provider's do; the resumed run must take their results instead of submitting the same calls again.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from flowllm.emulator import Emulator
from flowllm.engine.recorder import read_json
from tests.experiment.helpers import GAIA, ONLY_PYTHON_TOOL, gaia_overrides, run_flowllm, start_flowllm

pytestmark = pytest.mark.long

CALL_TOOL = """<use_mcp_tool>
<server_name>tool-python</server_name>
<tool_name>run_python</tool_name>
<arguments>{"code": "print(1)"}</arguments>
</use_mcp_tool>"""
BATCHED = ("provider.batch.enabled=true", "provider.batch.max_wait_s=0.3", "provider.batch.poll_s=0.05")


def answers(run_dir: Path) -> dict[str, tuple[str, str | None, bool]]:
    out = {}
    for result in sorted((run_dir / "tasks").glob("*/result.json")):
        data = read_json(result)
        out[data["task_id"]] = (data["status"], data["answer"], data["correct"])
    return out


@pytest.mark.parametrize("protocol", ["anthropic", "openai_chat", "openai_responses"])
def test_a_batched_run_gives_the_direct_runs_answers_at_half_the_cost(tmp_path: Path, protocol: str) -> None:
    direct, batched = tmp_path / "direct", tmp_path / "batched"
    wire = f"provider.protocol={protocol}"
    first = run_flowllm(*gaia_overrides(f"hydra.run.dir={direct}", wire, *ONLY_PYTHON_TOOL))
    second = run_flowllm(*gaia_overrides(f"hydra.run.dir={batched}", wire, *ONLY_PYTHON_TOOL, *BATCHED))
    assert first.returncode == second.returncode == 3, second.stderr[-2000:]  # the fixture's missing attachment
    assert answers(batched) == answers(direct) and len(answers(direct)) == 5
    plain, cheap = read_json(direct / "summary.json"), read_json(batched / "summary.json")
    assert cheap["accuracy"] == plain["accuracy"] and cheap["usage"] == plain["usage"]
    assert cheap["cost"]["batch_factor"] == 0.5
    assert abs(cheap["cost_usd"] - plain["cost_usd"] / 2) < 1e-5
    assert abs(cheap["providers"]["cost_usd"] - plain["providers"]["cost_usd"] / 2) < 1e-5
    lines = [json.loads(x) for x in (batched / "usage.jsonl").read_text().splitlines()]
    assert all(a.get("batch") for a in lines if a["type"] == "attempt" and a["outcome"] == "ok")
    # The wire response is recorded per call as with a direct call, with its batch id.
    outputs = [read_json(p) for p in batched.glob("tasks/*/turn_001/*call_model*/output.json")]
    assert outputs and all('"_flowllm_batch": {"id": ' in json.dumps(o) for o in outputs)


def test_a_batched_run_killed_mid_batch_resumes_without_paying_twice(tmp_path: Path) -> None:
    script = yaml.safe_load((GAIA / "script.yaml").read_text())
    script["batches"] = {"polls": 60}  # each batch stays in progress for 60 polls (3 s at poll_s 0.05)
    # An emulator the run did not start cannot tell a batch item's task (nothing but the request is sent): every
    # call gets the default, a tool call and then an answer, so the resumed run's second turns need new batches.
    script["default"] = [{"text": CALL_TOOL}, {"text": "\\boxed{none}"}]
    run_dir = tmp_path / "run"
    with Emulator(script) as emu:
        settings = (
            "+experiment=gaia",
            "progress=false",
            f"dataset.path={GAIA}",
            f"hydra.run.dir={run_dir}",
            "provider.emulator_script=null",  # the emulator started here serves the run: it outlives the kill
            f"provider.base_url={emu.base_url}",
            "preflight.providers=false",
            "tools=none",
            *BATCHED,
        )
        proc = start_flowllm(*settings, log=tmp_path / "first.log")
        journal = run_dir / "batches.jsonl"
        deadline = time.monotonic() + 120
        while not (journal.is_file() and journal.read_text().strip()) and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        submitted = [e for e in map(json.loads, journal.read_text().splitlines()) if "batch" in e]
        assert submitted, "the first run submitted a batch before it was killed"
        before = len(emu._app.batches.batches)

        resumed = run_flowllm(*settings)
        assert resumed.returncode == 3, resumed.stderr[-2000:]
    lines = [json.loads(x) for x in (run_dir / "usage.jsonl").read_text().splitlines()]
    reused = [a for a in lines if a["type"] == "attempt" and (a.get("batch") or {}).get("reused")]
    first_items = {item for entry in submitted for item in entry["items"]}
    assert len(reused) == len(first_items), "every call of the killed run's batches was answered from them"
    # Nobody had read those results before the kill: they are billed once, now, at the batch price.
    assert all(not a["batch"]["billed_before"] and a["cost_usd"] > 0 for a in reused)
    journal_items = [i for e in map(json.loads, journal.read_text().splitlines()) for i in e.get("items", [])]
    assert len(journal_items) == len(set(journal_items)), "no call was submitted in two batches"
    assert len(emu._app.batches.batches) > before
    assert len(answers(run_dir)) == 5


def test_each_epoch_and_attempt_is_its_own_batched_request(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_flowllm(
        *gaia_overrides(
            f"hydra.run.dir={run_dir}", "tools=none", "experiment.epochs=2", "experiment.attempts=2", *BATCHED
        )
    )
    assert proc.returncode == 3, proc.stderr[-2000:]  # the fixture's missing attachment
    lines = [json.loads(x) for x in (run_dir / "usage.jsonl").read_text().splitlines()]
    answered = [a for a in lines if a["type"] == "attempt" and a["outcome"] == "ok"]
    assert any(a["epoch"] == 2 for a in answered) and any(a["attempt"] == 1 for a in answered)
    for task in {a["task_id"] for a in answered}:  # a task's epochs run one after the other: never one batch
        first, second = (
            {a["batch"]["id"] for a in answered if (a["task_id"], a["epoch"]) == (task, n)} for n in (1, 2)
        )
        assert second and not first & second, f"{task}: epoch 2 was answered from epoch 1's batches"
    journal = [json.loads(x) for x in (run_dir / "batches.jsonl").read_text().splitlines()]
    items = [item for entry in journal for item in entry.get("items", [])]
    # Every answer was asked for once: the wrong task's second attempt too (pass@k), in each epoch.
    assert len(items) == len(set(items)) == len(answered)
