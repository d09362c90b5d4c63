"""Resume only what the same settings produced: the run directory's fingerprint, its refusal naming each
differing setting, experiment.resume=force, and the history of what ran."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from omegaconf import DictConfig

from flowllm.engine.recorder import read_json
from flowllm.errors import BuildError, ConfigError, FingerprintMismatch
from flowllm.setup.fingerprint import ResumeMode, guard, read_fingerprint, resume_mode
from tests.experiment.helpers import GAIA, LIST_TASK, WRONG_TASK, gaia_overrides, run_flowllm

Compose = Callable[[Sequence[str]], DictConfig]


def _with_result(run_dir: Path) -> None:
    (run_dir / "tasks" / "t").mkdir(parents=True)
    (run_dir / "tasks" / "t" / "result.json").write_text("{}")


def _guard(cfg: DictConfig, run_dir: Path, data: Path = GAIA, overrides: Sequence[str] = ()) -> None:
    guard(cfg, run_dir, data, overrides=list(overrides))


def test_settings_that_cannot_change_a_result_never_block(composed: Compose, tmp_path: Path) -> None:
    _guard(composed(gaia_overrides()), tmp_path)
    _with_result(tmp_path)
    neutral = gaia_overrides(
        "experiment.max_concurrent=1",
        "experiment.workers=2",
        "runner=legacy",
        "progress=true",
        "preflight.tools=false",
        "recorder.snapshot=none",
        "experiment.progress_interval_s=1",
        f"dataset.task_ids=[{LIST_TASK}]",
        "provider.rate_limit.max_in_flight=2",
    )
    _guard(composed(neutral), tmp_path)  # no error


def test_a_changed_setting_is_refused_naming_each_one(composed: Compose, tmp_path: Path) -> None:
    _guard(composed(gaia_overrides("repair=full")), tmp_path)
    _with_result(tmp_path)
    changed = composed(gaia_overrides("repair=strict", "provider=offline_chat", "agent.max_turns=3"))
    with pytest.raises(FingerprintMismatch) as info:
        _guard(changed, tmp_path)
    assert isinstance(info.value, BuildError)  # exit 2: nothing ran
    lines = str(info.value).splitlines()
    assert "experiment.resume=force" in lines[0]
    assert "agent.max_turns: 20 before, 3 now" in lines
    assert "repair.name: 'full' before, 'strict' now" in lines
    assert "provider.protocol: 'anthropic' before, 'openai_chat' now" in lines
    assert not any(line.startswith(("runner", "experiment.max_concurrent")) for line in lines)


def test_a_changed_dataset_file_is_refused(composed: Compose, tmp_path: Path) -> None:
    data = tmp_path / "gaia"
    shutil.copytree(GAIA, data)
    run_dir = tmp_path / "run"
    cfg = composed(gaia_overrides())
    _guard(cfg, run_dir, data)
    _with_result(run_dir)
    with (data / "metadata.jsonl").open("a") as handle:
        handle.write("\n")
    changed = r"dataset file metadata\.jsonl: sha256 \w{12} before, sha256 \w{12} now"
    with pytest.raises(FingerprintMismatch, match=changed):
        _guard(cfg, run_dir, data)


def test_without_results_the_old_fingerprint_is_replaced(composed: Compose, tmp_path: Path) -> None:
    # A run that stopped in its preflight produced nothing: fixing its settings is not a conflict.
    _guard(composed(gaia_overrides("repair=full")), tmp_path)
    _guard(composed(gaia_overrides("repair=strict")), tmp_path)
    saved = read_fingerprint(tmp_path)
    assert saved is not None and saved.settings["repair.name"] == "strict" and saved.earlier == []


def test_force_proceeds_and_records_both_fingerprints_and_the_history(composed: Compose, tmp_path: Path) -> None:
    _guard(composed(gaia_overrides("repair=full")), tmp_path, overrides=["repair=full"])
    first = read_fingerprint(tmp_path)
    _with_result(tmp_path)
    forced = ["repair=strict", "experiment.resume=force"]
    _guard(composed(gaia_overrides(*forced)), tmp_path, overrides=forced)
    now = read_fingerprint(tmp_path)
    assert first is not None and now is not None
    assert [e["fingerprint"] for e in now.earlier] == [first.digest]
    assert now.earlier[0]["settings"]["repair.name"] == "full"
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [h["overrides"] for h in history] == [["repair=full"], forced]
    assert [h["resume"] for h in history] == ["true", "force"]
    assert history[1]["forced_over"] == first.digest and history[1]["fingerprint"] == now.digest
    # The mix stays on record: a plain resume with the new settings keeps the earlier fingerprint.
    _guard(composed(gaia_overrides("repair=strict")), tmp_path)
    again = read_fingerprint(tmp_path)
    assert again is not None and [e["fingerprint"] for e in again.earlier] == [first.digest]


@pytest.mark.parametrize(
    ("value", "mode"), [(True, ResumeMode.on), (False, ResumeMode.off), ("force", ResumeMode.force)]
)
def test_resume_modes(value: object, mode: ResumeMode) -> None:
    assert resume_mode(value) is mode


def test_an_unknown_resume_mode_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"experiment\.resume must be true, false or force, not 'forced'"):
        resume_mode("forced")


def test_a_rerun_with_other_settings_is_refused_through_the_command_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    base = gaia_overrides("tools=none", f"hydra.run.dir={run_dir}", f"dataset.task_ids=[{LIST_TASK}]")
    first = run_flowllm(*base, "repair=full")
    assert first.returncode == 0, first.stderr[-2000:]
    more = gaia_overrides("tools=none", f"hydra.run.dir={run_dir}", f"dataset.task_ids=[{LIST_TASK},{WRONG_TASK}]")
    refused = run_flowllm(*more, "repair=strict", "provider=offline_chat", "experiment.max_concurrent=1")
    assert refused.returncode == 2
    errors = refused.stderr.strip().splitlines()
    assert all(line.startswith("flowllm: error: ") for line in errors)
    assert "flowllm: error: repair.name: 'full' before, 'strict' now" in errors
    assert not any("max_concurrent" in line for line in errors)
    assert not (run_dir / "tasks" / WRONG_TASK).exists()  # nothing ran
    # The same settings (a neutral one changed) resume; force mixes, and both settings stay on record.
    resumed = run_flowllm(*more, "repair=full", "experiment.max_concurrent=1", "runner=legacy")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert read_json(run_dir / "summary.json")["resumed"] == 1
    history = (run_dir / "history.jsonl").read_text().splitlines()
    assert len(history) == 2  # the refused rerun never started: not in the history
    assert "repair=full" in json.loads(history[0])["overrides"]


def test_a_refused_rerun_leaves_the_saved_config_as_it_was(tmp_path: Path) -> None:
    # Hydra used to write .hydra/ before the folder was checked: a refused rerun replaced the config that ran.
    run_dir = tmp_path / "run"
    base = gaia_overrides("tools=none", f"hydra.run.dir={run_dir}", f"dataset.task_ids=[{LIST_TASK}]")
    assert run_flowllm(*base, "repair=full").returncode == 0
    names = ("config.yaml", "hydra.yaml", "overrides.yaml")
    record = {name: (run_dir / ".hydra" / name).read_bytes() for name in names}
    assert b"repair=full" in record["overrides.yaml"]
    assert run_flowllm(*base, "repair=strict").returncode == 2
    assert {name: (run_dir / ".hydra" / name).read_bytes() for name in record} == record
    # An accepted rerun is the config that ran now: its record replaces the earlier one.
    assert run_flowllm(*base, "repair=full", "experiment.max_concurrent=1").returncode == 0
    assert b"experiment.max_concurrent=1" in (run_dir / ".hydra" / "overrides.yaml").read_bytes()


def test_a_rerun_that_leaves_out_tasks_the_folder_has_results_of_is_refused(tmp_path: Path) -> None:
    """A run of two tasks, rerun into its folder with one selected: its summary counted one task while the folder
    held two, and every reader of the folder (the exports, diff, scale, a bundle) read both: an Inspect log of two
    samples beside a summary of one, a bundle that did not reproduce."""
    run_dir = tmp_path / "run"
    both = gaia_overrides("tools=none", f"hydra.run.dir={run_dir}", f"dataset.task_ids=[{LIST_TASK},{WRONG_TASK}]")
    assert run_flowllm(*both).returncode == 0
    summary = (run_dir / "summary.json").read_bytes()
    one = gaia_overrides("tools=none", f"hydra.run.dir={run_dir}", f"dataset.task_ids=[{LIST_TASK}]")
    refused = run_flowllm(*one)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines() == [
        f"flowllm: error: {run_dir} holds results of 1 task this run does not select ({WRONG_TASK}): its summary "
        "would count fewer tasks than the folder holds; select them too, or run into a new hydra.run.dir"
    ]
    assert (run_dir / "summary.json").read_bytes() == summary
    assert len((run_dir / "history.jsonl").read_text().splitlines()) == 1  # it never started
