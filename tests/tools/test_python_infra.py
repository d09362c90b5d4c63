"""run_python refusing code because the isolation it requires is missing here is the machine's failure: its
error result carries the infrastructure cause; a script that fails on its own does not."""

from __future__ import annotations

from pathlib import Path

import mcp
import pytest

from flowllm.core.types import InfraCause
from flowllm.tools import python as python_tool
from flowllm.tools.needs import result_infra
from flowllm.tools.sandbox.call import REFUSED_EXIT, SandboxLimits, SandboxResult


async def call(result: SandboxResult, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    async def canned(code: str, folder: Path, limits: SandboxLimits) -> SandboxResult:
        return result

    monkeypatch.setattr(python_tool, "run_python_code", canned)
    async with mcp.Client(python_tool.build_server(workspace, SandboxLimits())) as client:
        return await client.call_tool("run_python", {"code": "print(1)"})


async def test_a_refused_sandbox_is_an_infrastructure_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refused = await call(SandboxResult("", "", REFUSED_EXIT, gaps=["cgroup"]), tmp_path, monkeypatch)
    assert refused.is_error and result_infra(refused) is InfraCause.SANDBOX  # type: ignore[attr-defined]
    failed = await call(SandboxResult("", "NameError: x", 1), tmp_path, monkeypatch)
    assert failed.is_error and result_infra(failed) is None  # type: ignore[attr-defined]
