"""``summary.json`` → ``provenance``: what a run's numbers were produced with, beyond its settings.

flowllm's version and, when it runs from a git checkout, the commit and whether the work tree had changes; the
Python version; the versions of the SDKs and parsers whose behaviour shapes results (from the installed
distributions' metadata, "not installed" when absent); the dataset's file hashes and the config fingerprint
(flowllm/setup/fingerprint.py, with the earlier fingerprints a forced resume mixed in); the price
table's hash; the host's operating system. A value that cannot be had is said to be not known, never guessed.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import flowllm
from flowllm.setup.fingerprint import read_fingerprint

# The distributions whose versions can change what a task gives: the provider SDKs, the MCP client and servers,
# the document and page readers, the JSON parsers, the HTTP client, and the config and graph libraries.
RESULT_PACKAGES = (
    "anthropic",
    "openai",
    "mcp",
    "httpx2",
    "markitdown",
    "trafilatura",
    "lxml",
    "lxml_html_clean",
    "pypdf",
    "json5",
    "json-repair",
    "hydra-core",
    "omegaconf",
    "networkx",
    "pydantic",
)
NOT_INSTALLED = "not installed"
NOT_KNOWN = "not known"
GIT_TIMEOUT_S = 10.0


def package_versions(names: tuple[str, ...] = RESULT_PACKAGES) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = NOT_INSTALLED
    return versions


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def flowllm_source() -> dict[str, Any]:
    """flowllm's version; its git commit and dirty flag when it runs from a checkout (None: not a checkout)."""
    try:
        version = metadata.version("flowllm")
    except metadata.PackageNotFoundError:
        version = NOT_KNOWN
    root = Path(flowllm.__file__).resolve().parent.parent
    info: dict[str, Any] = {"version": version, "commit": None, "dirty": None}
    if not (root / ".git").exists():
        return info
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        info["commit"] = NOT_KNOWN
        return info
    info["commit"] = commit.strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    info["dirty"] = None if status is None else bool(status.strip())
    return info


def file_sha256(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None


def host_os() -> dict[str, str]:
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "platform": platform.platform(),
    }


def collect(run_dir: Path, price_table: Path) -> dict[str, Any]:
    """The provenance of the run in ``run_dir`` (its fingerprint read from the folder)."""
    recorded = read_fingerprint(run_dir)
    return {
        "flowllm": flowllm_source(),
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
        "packages": package_versions(),
        "config_fingerprint": recorded.digest if recorded is not None else NOT_KNOWN,
        # Results of other settings kept in the folder by experiment.resume=force.
        "earlier_fingerprints": [e.get("fingerprint") for e in recorded.earlier] if recorded is not None else [],
        "dataset_files": dict(recorded.dataset_files) if recorded is not None else NOT_KNOWN,
        "price_table": {"path": str(price_table), "sha256": file_sha256(price_table) or NOT_KNOWN},
        "os": host_os(),
    }
