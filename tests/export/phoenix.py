"""A real Arize Phoenix server on loopback, as the OTLP receiver of the telemetry tests.

Phoenix pulls in many packages, so it lives in a virtual environment of its own (``.ci/run`` makes one in
``.ci-phoenix``). The server is found through ``FLOWLLM_PHOENIX`` (the ``phoenix`` executable) or at
``.ci-phoenix/bin/phoenix``; without it the tests are skipped, saying why. It runs on OS-assigned free ports
with its database in a temp folder, and its spans are read back through its REST API.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx

from tests.compat.server import stop_process

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CI_BINARY = PROJECT_ROOT / ".ci-phoenix" / "bin" / "phoenix"
START_TIMEOUT_S = 600  # a hang guard: Phoenix migrates its database at start, minutes on a loaded machine
POLL_S = 0.5


def phoenix_binary() -> str | None:
    named = os.environ.get("FLOWLLM_PHOENIX")
    if named:
        return named if Path(named).is_file() else shutil.which(named)
    return str(CI_BINARY) if CI_BINARY.is_file() else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Phoenix:
    url: str

    def spans(self, project: str = "default") -> list[dict[str, Any]]:
        """Every span of the project, through the REST API (all pages)."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        with httpx.Client(timeout=30) as client:
            while True:
                params: dict[str, Any] = {"limit": 1000}
                if cursor:
                    params["cursor"] = cursor
                reply = client.get(f"{self.url}/v1/projects/{project}/spans", params=params)
                if reply.status_code == 404:  # no span yet: the project does not exist
                    return found
                reply.raise_for_status()
                body = reply.json()
                found.extend(body["data"])
                cursor = body.get("next_cursor")
                if not cursor:
                    return found

    def wait_for(self, run_dir: Path, count: int, timeout_s: float = 120.0) -> list[dict[str, Any]]:
        """The spans of ``run_dir`` once ``count`` of them are stored (ingestion is asynchronous); a hang guard."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = [s for s in self.spans() if s["attributes"].get("flowllm.run_dir") == str(run_dir)]
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(POLL_S)


@contextmanager
def run_phoenix(binary: str, workdir: Path) -> Iterator[Phoenix]:
    port, grpc = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = (workdir / "phoenix.log").open("wb")
    proc = subprocess.Popen([binary, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"phoenix exited {proc.returncode}: see {workdir / 'phoenix.log'}")
            try:
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"phoenix did not answer within {START_TIMEOUT_S}s")
            time.sleep(POLL_S)
        yield Phoenix(url)
    finally:
        stop_process(proc)
        log.close()
