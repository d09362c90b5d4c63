"""The bundle file: a tar compressed with zstd (the ``zstandard`` package) or, without it, gzip.

Writing streams each file into the archive and the manifest last; the file appears under its name only once it
is complete. Reading unpacks into a folder given (a fresh temporary one) with tarfile's ``data`` filter (no
absolute paths, no links out, no devices), and any archive that does not read to its end is bad input.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from flowllm.bundle.manifest import BundleInputError

__all__ = ["GZIP", "ZSTD", "compression_available", "read_bundle", "write_bundle"]

ZSTD = "zstd"
GZIP = "gzip"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_GZIP_MAGIC = b"\x1f\x8b"
ZSTD_LEVEL = 10


def compression_available() -> str:
    """zstd when the ``zstandard`` package imports, else gzip."""
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return GZIP
    return ZSTD


@contextmanager
def _compressed_writer(handle: IO[bytes], compression: str) -> Iterator[IO[bytes] | gzip.GzipFile]:
    if compression == ZSTD:
        import zstandard

        with zstandard.ZstdCompressor(level=ZSTD_LEVEL).stream_writer(handle, closefd=False) as writer:
            yield writer
    else:
        with gzip.GzipFile(filename="", fileobj=handle, mode="wb", mtime=0) as writer:
            yield writer


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_bundle(out: Path, files: Iterable[tuple[str, bytes]], compression: str) -> None:
    """``files`` (archive name, content, in order) into ``out``, written beside it first and moved in place."""
    partial = out.with_name(out.name + ".partial")
    try:
        with (
            partial.open("wb") as handle,
            _compressed_writer(handle, compression) as stream,
            tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name, data in files:
                _add(tar, name, data)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def _open_stream(handle: IO[bytes], path: Path) -> tuple[str, IO[bytes] | gzip.GzipFile]:
    head = handle.read(4)
    handle.seek(0)
    if head.startswith(_ZSTD_MAGIC):
        try:
            import zstandard
        except ImportError:
            raise BundleInputError(f"{path} is zstd-compressed: install zstandard (pip install zstandard)") from None
        return ZSTD, zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True)
    if head.startswith(_GZIP_MAGIC):
        return GZIP, gzip.GzipFile(fileobj=handle, mode="rb")
    raise BundleInputError(f"{path} is not a flowllm bundle (neither a zstd nor a gzip archive)")


def read_bundle(path: Path, dest: Path) -> str:
    """Unpack the bundle ``path`` into ``dest``; returns its compression. Raises ``BundleInputError`` for a file
    that is missing, not an archive, or truncated."""
    if not path.is_file():
        raise BundleInputError(f"{path} is not a file (a bundle written by flowllm bundle)")
    with path.open("rb") as handle:
        compression, stream = _open_stream(handle, path)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    if not member.isfile():
                        raise BundleInputError(f"{path}: {member.name} is not a regular file: not a flowllm bundle")
                    tar.extract(member, dest, filter="data")
        except BundleInputError:
            raise
        except (tarfile.TarError, EOFError, OSError, zlib.error, ValueError) as exc:
            raise BundleInputError(f"{path} cannot be unpacked (truncated or not a bundle): {exc}") from None
        except Exception as exc:  # zstandard.ZstdError: a damaged or cut-off frame
            if type(exc).__name__ == "ZstdError":
                raise BundleInputError(f"{path} cannot be unpacked (truncated or damaged): {exc}") from None
            raise
    return compression
