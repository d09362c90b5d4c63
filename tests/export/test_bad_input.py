"""Bad input to the exports: one line each, exit status 2, nothing written half."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flowllm.export.source import ExportError, write_atomically
from flowllm.inspect.cli import main as inspect_main
from tests.appfork import run_app
from tests.export.phoenix import free_port
from tests.export.runs import export_run
from tests.replay.runs import run_flowllm

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def export(*args: str) -> subprocess.CompletedProcess[str]:
    return run_app(["export", *args], module="flowllm.inspect", cwd=PROJECT_ROOT, env=dict(os.environ), timeout=600)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("fmt", ["inspect", "gaia-submission"])
def test_a_folder_that_is_not_a_run_writes_nothing(tmp_path: Path, fmt: str) -> None:
    (tmp_path / "notes").mkdir()
    target = tmp_path / ("out.eval" if fmt == "inspect" else "out.jsonl")
    line = one_error_line(export(str(tmp_path / "notes"), "--format", fmt, "-o", str(target)))
    assert "is not a flowllm run" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


def test_an_unreachable_endpoint_is_one_line(saved_run: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = one_error_line(export(str(saved_run), "--format", "otlp", "--endpoint", url))
    assert f"cannot reach the OTLP endpoint {url}/v1/traces" in line


def test_missing_arguments_are_one_line(saved_run: Path) -> None:
    assert "needs --endpoint" in one_error_line(export(str(saved_run), "--format", "otlp"))
    assert "needs -o FILE" in one_error_line(export(str(saved_run), "--format", "inspect"))
    assert "not-a-url" in one_error_line(export(str(saved_run), "--format", "otlp", "--endpoint", "not-a-url"))


def test_a_run_still_running_exports_what_is_finished(saved_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "running"
    shutil.copytree(saved_run, run, ignore=shutil.ignore_patterns("workspace"))
    (run / "summary.json").unlink()
    (run / "tasks" / "wrong" / "result.json").unlink()  # its turns are there, its result not yet
    target = tmp_path / "partial.jsonl"
    done = export(str(run), "--format", "gaia-submission", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert (
        "still running" in done.stdout and "exporting the 1 finished task(s), leaving out 1 unfinished" in done.stdout
    )
    answers = {
        json.loads(line)["task_id"]: json.loads(line)["model_answer"] for line in target.read_text().splitlines()
    }
    assert answers == {"delegate": "385", "wrong": "", "not-run": ""}
    if importlib.util.find_spec("inspect_ai") is not None:
        from inspect_ai.log import read_eval_log

        log_file = tmp_path / "partial.eval"
        assert export(str(run), "--format", "inspect", "-o", str(log_file)).returncode == 0
        log = read_eval_log(str(log_file))
        assert log.status == "started" and [s.id for s in log.samples or []] == ["delegate"]
        assert log.eval.metadata is not None and log.eval.metadata["unfinished_tasks"] == ["wrong"]


@pytest.mark.parametrize(
    ("fmt", "module", "extra"),
    [("inspect", "inspect_ai", "flowllm[inspect]"), ("otlp", "opentelemetry.sdk", "flowllm[telemetry]")],
)
def test_a_missing_optional_package_names_the_install_command(
    saved_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    module: str,
    extra: str,
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == module else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    args = ["-o", str(tmp_path / "x.eval")] if fmt == "inspect" else ["--endpoint", "http://127.0.0.1:9"]
    assert inspect_main(["export", str(saved_run), "--format", fmt, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f'pip install "{extra}"' in err[0]
    assert not (tmp_path / "x.eval").exists()


def test_analysis_without_pandas_names_the_install_command(monkeypatch: pytest.MonkeyPatch, saved_run: Path) -> None:
    from flowllm import analysis

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pandas" else real(name, *a))
    with pytest.raises(analysis.AnalysisUnavailable, match=r'pip install "flowllm\[analysis\]"'):
        analysis.load(saved_run)


def test_a_write_that_fails_leaves_no_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("the previous export\n")

    def half(tmp: Path) -> None:
        tmp.write_text("half of it")
        raise OSError(28, "No space left on device")

    with pytest.raises(ExportError, match="No space left on device"):
        write_atomically(target, half)
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
    assert target.read_text() == "the previous export\n"
    with pytest.raises(ExportError, match="does not exist"):
        write_atomically(tmp_path / "missing" / "out.jsonl", lambda tmp: tmp.write_text("x"))


def test_a_live_run_with_a_dead_endpoint_completes_with_one_warning(tmp_path: Path) -> None:
    done = export_run(tmp_path, f"telemetry.otlp_endpoint=http://127.0.0.1:{free_port()}").check()
    warnings = [line for line in done.app_log.splitlines() if "telemetry" in line]
    assert len(warnings) == 1 and "cannot reach the OTLP endpoint" in warnings[0], warnings
    assert json.loads((done.run_dir / "summary.json").read_text())["completed"] == 2


def test_a_malformed_endpoint_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    done = export_run(tmp_path, "telemetry.otlp_endpoint=ftp://example").check(2)
    assert "telemetry.otlp_endpoint must be an http(s) URL" in done.stderr
    assert not (done.run_dir / "tasks").exists()


def test_telemetry_without_the_sdk_is_refused_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowllm.errors import ConfigError
    from flowllm.telemetry.live import check_telemetry

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "opentelemetry.sdk" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r'telemetry.otlp_endpoint is set, but .*pip install "flowllm\[telemetry\]"'):
        check_telemetry("http://127.0.0.1:6006")
    check_telemetry(None)  # not set: nothing is needed


def test_a_replay_or_fork_sends_no_spans_to_the_saved_runs_receiver(tmp_path: Path) -> None:
    # The saved run had a receiver (dead here: its one warning shows that telemetry was on); a replay and a fork
    # without telemetry.otlp_endpoint use their own config's telemetry, which has none.
    saved = export_run(tmp_path, f"telemetry.otlp_endpoint=http://127.0.0.1:{free_port()}").check()
    assert "cannot reach the OTLP endpoint" in saved.app_log
    replay = ("provider=replay", f"provider.run_dir={saved.run_dir}")
    for name, extra in (("replay", ()), ("fork", ("provider.fork=live", "provider.live=offline", "repair=strict"))):
        done = run_flowllm(tmp_path / name, *replay, *extra).check()
        assert "telemetry" not in done.app_log, (name, done.app_log)
        assert "otlp_endpoint: null" in (done.run_dir / ".hydra" / "config.yaml").read_text()
