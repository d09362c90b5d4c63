"""The error tree: every class filed once under BuildError or RunError, drawn in flowllm/errors.py, and the
exit code chosen by class."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import flowllm
from flowllm import errors
from flowllm.cli.listing import help_text
from flowllm.engine.errors import NodeContractError
from flowllm.errors import BuildError, CarriedError, CliError, ConfigError, FlowError, RunError, RunStopped
from flowllm.exit_codes import ExitCode, error_exit_code, run_exit_code, sweep_exit_code
from flowllm.export.source import ExportError
from flowllm.inspect import cli as inspect_cli
from flowllm.inspect.artifacts import NotARunError
from flowllm.inspect.paired import NoCommonTasks
from flowllm.inspect.power import PowerUsageError
from flowllm.inspect.usage import UsageInputError
from flowllm.providers.errors import ProviderConfigError
from flowllm.setup.checks import RunDirCheck
from flowllm.sweep.summary import read_job
from tests.inspect.minirun import write_run


def _all_subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_all_subclasses(sub)}
    return found


def _flow_errors() -> set[type]:
    for info in pkgutil.walk_packages(flowllm.__path__, "flowllm."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra (ray, ...) that is not installed
            continue
    return {c for c in _all_subclasses(FlowError) if c.__module__.startswith("flowllm.")}


def test_every_error_is_a_build_a_run_or_a_cli_error_and_only_one() -> None:
    classes = _flow_errors() - {BuildError, RunError, CliError}
    assert classes, "no error classes found"
    for cls in classes:
        kinds = [issubclass(cls, kind) for kind in (BuildError, RunError, CliError)]
        assert kinds.count(True) == 1, cls


def test_every_error_class_is_drawn_in_the_tree() -> None:
    drawn = set(re.findall(r"[├└]── (\w+)", errors.__doc__ or ""))
    names = {c.__name__ for c in _flow_errors()}
    assert names - drawn == set(), f"not drawn: {sorted(names - drawn)}"
    assert drawn - names == set(), f"drawn but not defined: {sorted(drawn - names)}"


def test_misfiled_classes_are_fixed() -> None:
    assert issubclass(ProviderConfigError, BuildError) and not issubclass(ProviderConfigError, RunError)
    assert issubclass(NodeContractError, RunError)
    assert not hasattr(errors, "ToolError")  # MCP's ToolError is the one tools raise


def test_exit_code_follows_the_class() -> None:
    assert error_exit_code(ProviderConfigError("no key")) is ExitCode.CONFIG
    some = RunStopped("worker 1 of 2 exited", {"status": "failed", "completed": 3, "failed": 0, "unfinished": 2})
    assert error_exit_code(some) is ExitCode.SOME_FAILED
    none = RunStopped("worker 1 of 2 exited", {"status": "failed", "completed": 0, "failed": 1, "unfinished": 4})
    assert error_exit_code(none) is ExitCode.ALL_FAILED
    assert error_exit_code(NodeContractError("bad outputs", node="x")) is not ExitCode.CONFIG


def test_the_inspect_commands_errors_are_cli_errors_that_exit_2() -> None:
    classes = (
        inspect_cli.UsageError,
        inspect_cli.NotFound,
        NotARunError,
        NoCommonTasks,
        UsageInputError,
        PowerUsageError,
        ExportError,
    )
    for cls in classes:
        assert issubclass(cls, CliError) and cls("x").exit_code == ExitCode.CONFIG, cls


def test_a_task_the_run_does_not_have_is_bad_input_not_a_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "run")
    assert inspect_cli.main([str(tmp_path / "run"), "task", "no-such-task"]) == 2
    assert "flowllm.inspect: error: " in capsys.readouterr().err


def test_an_unwritable_run_folder_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    config = OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "file" / "run")}}})
    with pytest.raises(CarriedError) as carried:  # past Hydra's callback runner, which only warns on an Exception
        RunDirCheck().on_run_start(config)
    assert isinstance(carried.value.error, ConfigError) and error_exit_code(carried.value.error) is ExitCode.CONFIG
    assert "cannot be written" in str(carried.value.error) and "hydra.run.dir=<folder>" in str(carried.value.error)


def test_a_budget_stop_has_its_own_code_3_in_a_run_a_sweep_and_the_help(tmp_path: Path) -> None:
    assert ExitCode.BUDGET is not ExitCode.SOME_FAILED and int(ExitCode.BUDGET) == 3
    summary = {"status": "completed", "completed": 2, "failed": 0, "budget": {"ended_run": True}}
    assert run_exit_code(summary) is ExitCode.BUDGET
    job = tmp_path / "sweep" / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- repair=strict\n")
    (job / "summary.json").write_text(json.dumps(summary))
    row = read_job(job, tmp_path / "sweep").to_dict()
    assert sweep_exit_code([row]) is ExitCode.BUDGET
    failed = {**row, "failed": 1, "budget": None}
    assert sweep_exit_code([row, failed]) is ExitCode.SOME_FAILED
    assert "3 the run's budget (experiment.budget) ended it" in " ".join(help_text().split())


def test_the_kinds_retried_by_default_are_defined_once_and_the_schema_and_breaker_follow() -> None:
    from flowllm.config.provider_schema import BreakerConfig, RetryConfig
    from flowllm.errors import DEFAULT_RETRY_ON, ErrorKind
    from flowllm.providers.breaker import CircuitBreaker
    from flowllm.providers.errors import ProviderCallError
    from flowllm.providers.retry import RetryPolicy

    # The order the default config has always listed (a saved config's fingerprint depends on it).
    assert RetryConfig().retry_on == [
        "connection", "timeout", "rate_limit", "overloaded", "server", "conflict", "truncated",
        "stream_error", "bad_response", "empty_reply",
    ]  # fmt: skip
    assert [str(k) for k in DEFAULT_RETRY_ON] == RetryConfig().retry_on
    policy = RetryPolicy.from_config(RetryConfig())
    for kind in ErrorKind:
        error = ProviderCallError("failed", kind=kind)
        assert policy.retryable(error) is kind.retried_by_default
        breaker = CircuitBreaker("p", BreakerConfig(failure_threshold=1))
        breaker.record_failure(error)  # the breaker opens on exactly the kinds retried by default
        assert (breaker.state == "open") is kind.retried_by_default, kind
