"""The error tree: every class filed once under BuildError or RunError, drawn in flowllm/errors.py, and the
exit code chosen by class."""

from __future__ import annotations

import importlib
import pkgutil
import re

import flowllm
from flowllm import errors
from flowllm.engine.errors import NodeContractError
from flowllm.errors import BuildError, FlowError, RunError, RunStopped
from flowllm.exit_codes import ExitCode, error_exit_code
from flowllm.providers.errors import ProviderConfigError


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


def test_every_error_is_a_build_or_a_run_error_never_both() -> None:
    classes = _flow_errors() - {BuildError, RunError}
    assert classes, "no error classes found"
    for cls in classes:
        assert issubclass(cls, BuildError) != issubclass(cls, RunError), cls


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
