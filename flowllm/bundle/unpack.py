"""A bundle unpacked into a fresh folder and its manifest checked: every file listed is there with the hash the
manifest gives, no file is there that it does not list, and the manifest is the one its hash names."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from flowllm.bundle.archive import read_bundle
from flowllm.bundle.manifest import MANIFEST_FILE, MANIFEST_HASH_FILE, BundleInputError, Manifest, sha256

__all__ = ["Unpacked", "unpack", "unpacked_runs"]


@dataclass
class Unpacked:
    """The bundle in ``root``, its manifest, and each way the files disagree with it (empty: they agree)."""

    root: Path
    manifest: Manifest
    tampered: list[str] = field(default_factory=list)


def _file_hash(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def unpack(bundle: Path, dest: Path) -> Unpacked:
    """Unpack ``bundle`` into ``dest`` (a fresh folder) and check it against its manifest; raises
    ``BundleInputError`` for what is no bundle (no manifest, a newer format, a truncated archive)."""
    read_bundle(bundle, dest)
    manifest_path = dest / MANIFEST_FILE
    if not manifest_path.is_file():
        raise BundleInputError(f"{bundle} is not a flowllm bundle: it has no {MANIFEST_FILE}")
    body = manifest_path.read_bytes()
    manifest = Manifest.from_bytes(body)
    found = Unpacked(dest, manifest)
    hash_path = dest / MANIFEST_HASH_FILE
    recorded = hash_path.read_text(encoding="utf-8", errors="replace").strip() if hash_path.is_file() else None
    if recorded != sha256(body):
        found.tampered.append(f"{MANIFEST_FILE}: its SHA-256 is not the one {MANIFEST_HASH_FILE} records")
    on_disk = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} - {
        MANIFEST_FILE,
        MANIFEST_HASH_FILE,
    }
    for name, digest in sorted(manifest.files.items()):
        if name not in on_disk:
            found.tampered.append(f"{name}: listed in the manifest, missing from the bundle")
        elif _file_hash(dest / name) != digest:
            found.tampered.append(f"{name}: its SHA-256 differs from the manifest's (the file was changed)")
    found.tampered += [f"{name}: in the bundle, not in the manifest" for name in sorted(on_disk - set(manifest.files))]
    return found


def unpacked_runs(bundle: Path, dest: Path) -> Path:
    """The folder of the bundle's runs (one run, or a sweep's jobs) unpacked into ``dest``, for commands that read
    saved runs (``inspect scale``); raises ``BundleInputError`` naming every file that disagrees with the
    manifest, so nothing is computed from an edited bundle."""
    found = unpack(bundle, dest)
    if found.tampered:
        raise BundleInputError(f"{bundle} was changed after it was written: {'; '.join(found.tampered[:3])}")
    jobs = [job.name for job in found.manifest.jobs]
    runs = dest / "runs"
    return runs / jobs[0] if len(jobs) == 1 and not found.manifest.sweep else runs
