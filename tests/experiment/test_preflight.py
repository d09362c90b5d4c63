"""Preflight: every problem of a run found before the first task, listed together, one line each, exit 2."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from flowllm.config.provider_schema import ProviderConfig
from flowllm.setup.preflight import ProviderTarget, check_providers, check_tools
from tests.experiment.helpers import run_flowllm
from tests.loopback import serve_http


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_every_problem_is_listed_before_any_task(tmp_path: Path) -> None:
    port = _closed_port()  # nothing listens there
    live = [
        "progress=false",
        "provider=local",
        f"provider.base_url=http://127.0.0.1:{port}/v1",
        "tools.servers.tool-math.command=/nonexistent/bin/server",
    ]
    # What needs no server is said first, all of it, without starting a server or probing a provider that has
    # no key: no "cannot connect" after a missing key.
    proc = run_flowllm(
        *live,
        f"hydra.run.dir={tmp_path}",
        "provider.fallbacks=[claude]",  # a fallback without its key
        "dataset.path=/nonexistent/flowllm-data",
        env={"ANTHROPIC_API_KEY": ""},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert all(line.startswith("flowllm: error: ") for line in lines), proc.stderr
    text = "\n".join(lines)
    assert len(lines) == 2, text
    assert "ANTHROPIC_API_KEY" in text
    assert "/nonexistent/flowllm-data" in text
    assert "cannot connect" not in text and "did not start" not in proc.stdout + proc.stderr
    assert "preflight: starting" not in proc.stdout + proc.stderr
    # Those fixed, the live checks list theirs together.
    proc = run_flowllm(*live, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    text = "\n".join(lines)
    assert len(lines) == 2, text
    assert f"provider 'local' at http://127.0.0.1:{port}/v1: cannot connect" in text
    assert "tools.servers.tool-math: did not start" in text
    assert not (tmp_path / "tasks").exists() and "Traceback" not in proc.stderr


class _Models(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != "/v1/models":
            self.send_response(404)
            self.end_headers()
            return
        if self.headers.get("Authorization") != "Bearer good-key":
            self.send_response(401)
            body = b'{"error": {"message": "bad key"}}'
        else:
            self.send_response(200)
            body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "x"}]}).encode()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def models_server() -> Iterator[str]:
    with serve_http(_Models) as url:
        yield url


def _target(name: str, base_url: str, key_env: str | None, protocol: str = "openai_chat") -> ProviderTarget:
    return ProviderTarget(
        name, ProviderConfig(name=name, model="m", protocol=protocol, base_url=base_url, api_key_env=key_env)
    )


async def test_a_models_listing_through_the_sdk(models_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWLLM_TEST_GOOD", "good-key")
    monkeypatch.setenv("FLOWLLM_TEST_BAD", "bad-key")
    emulated = ProviderTarget("offline", ProviderConfig(name="offline", model="m", emulator_script="x.yaml"))
    problems = await check_providers(
        [
            _target("ok", f"{models_server}/v1", "FLOWLLM_TEST_GOOD"),
            _target("refused", f"{models_server}/v1", "FLOWLLM_TEST_BAD"),
            _target("no-v1", models_server, "FLOWLLM_TEST_GOOD"),
            emulated,  # started with the run: never probed
        ],
        timeout_s=10,
    )
    assert len(problems) == 2, problems
    refused, no_v1 = problems
    assert "provider 'refused'" in refused and "key was refused (HTTP 401)" in refused and "FLOWLLM_TEST_BAD" in refused
    assert "provider 'no-v1'" in no_v1 and "HTTP 404" in no_v1 and "/v1 missing" in no_v1


async def test_tool_settings_problems_are_one_line() -> None:
    problems, catalog = await check_tools({"servers": {"tool-math": {"command": ""}}}, 10)
    assert catalog is None and len(problems) == 1
    assert problems[0].startswith("tools.servers.tool-math: ") and "the command is empty" in problems[0]
    problems, _ = await check_tools({"scope": "forever", "servers": {}}, 10)
    assert problems == ["tools.scope must be one of task, run, not 'forever'"]
