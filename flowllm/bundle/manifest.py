"""A bundle's manifest: every file's SHA-256, each task's ground-truth hash, the dataset files the run read, and
the hash of the manifest itself (``manifest.sha256`` beside it).

A bundle written by a newer flowllm (a higher ``format_version``) is refused, not guessed at.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from flowllm.errors import CliError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "MANIFEST_HASH_FILE",
    "BundleInputError",
    "JobEntry",
    "Manifest",
    "sha256",
]

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
MANIFEST_HASH_FILE = "manifest.sha256"
KIND = "flowllm-bundle"


class BundleInputError(CliError):
    """What ``flowllm bundle`` or ``flowllm verify FILE`` was given cannot be used (not a run, not a bundle, a
    truncated or newer bundle, a changed dataset): exit 2, nothing written outside the temporary folder."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class JobEntry:
    """One run in the bundle: its folder inside the archive, the dataset path its config names, the dataset's
    file hashes (``fingerprint.json``) and each task's ground-truth hash (of the normalised answer)."""

    name: str  # the folder under ``runs/``
    dataset: str
    dataset_files: dict[str, str] = field(default_factory=dict)
    ground_truth: dict[str, str | None] = field(default_factory=dict)  # task id -> sha256, None: no answer
    masked: list[str] = field(default_factory=list)  # the files a secret value was masked in

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobEntry:
        return cls(
            name=str(data["name"]),
            dataset=str(data.get("dataset") or ""),
            dataset_files=dict(data.get("dataset_files") or {}),
            ground_truth=dict(data.get("ground_truth") or {}),
            masked=[str(name) for name in data.get("masked") or []],
        )


@dataclass
class Manifest:
    """``manifest.json``: what the archive holds and how it was made."""

    format_version: int
    flowllm_version: str
    compression: str  # zstd | gzip
    with_answers: bool
    sweep: bool
    jobs: list[JobEntry]
    files: dict[str, str]  # archive path -> sha256, every file but the manifest and its hash
    kind: str = KIND

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """The manifest read strictly; raises ``BundleInputError`` for anything else, or a newer format."""
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise BundleInputError(f"{MANIFEST_FILE} is not valid JSON: not a flowllm bundle") from None
        if not isinstance(raw, dict) or raw.get("kind") != KIND:
            raise BundleInputError(f"{MANIFEST_FILE} is not a flowllm bundle's manifest")
        version = raw.get("format_version")
        if not isinstance(version, int):
            raise BundleInputError(f"{MANIFEST_FILE} has no format_version: not a flowllm bundle")
        if version > FORMAT_VERSION:
            raise BundleInputError(
                f"the bundle's format is version {version}, newer than this flowllm reads ({FORMAT_VERSION}): "
                "upgrade flowllm to verify it"
            )
        try:
            return cls(
                format_version=version,
                flowllm_version=str(raw.get("flowllm_version") or ""),
                compression=str(raw["compression"]),
                with_answers=bool(raw["with_answers"]),
                sweep=bool(raw.get("sweep")),
                jobs=[JobEntry.from_dict(job) for job in raw["jobs"]],
                files={str(k): str(v) for k, v in raw["files"].items()},
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise BundleInputError(f"{MANIFEST_FILE} is incomplete ({exc}): not a flowllm bundle") from None
