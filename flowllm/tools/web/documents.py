"""Documents to text: the one converter behind ``read_file`` (local attachments) and ``read_url`` (downloads).

Office files, PDFs and HTML go through markitdown's converters, called directly with the type we already know
(so markitdown's content sniffer, an ONNX model, is never loaded); JSON, CSV shape lines, XML and plain text are
handled here because markitdown only passes them through. Zip containers (``.zip`` itself and the office
formats, which are zips) are measured from their central directory *before* any reader opens them: a member
count, an unpacked total and a compression ratio over the limits refuse the file, so a 200 KB zip bomb costs a
directory read, not minutes and gigabytes.

Everything here works on bytes already read (``convert(data, name)``): the caller decides how a file is opened
(``files.py`` refuses FIFOs, devices and hard links first) and how large it may be.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import zipfile
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePosixPath
from typing import Any


class DocumentError(Exception):
    """A document that cannot be shown: corrupt, over a limit, a missing reader. The message is for the model."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 64 * 1024 * 1024  # the file itself
    max_unpacked_bytes: int = 256 * 1024 * 1024  # sum of a zip's members once inflated
    max_ratio: float = 100.0  # unpacked / packed; real xlsx/docx files stay far below, bombs are in the 1000s
    max_members: int = 10_000
    max_depth: int = 2  # zips inside zips


DEFAULT_LIMITS = Limits()


class Kind(Enum):
    PDF = "pdf"
    DOCX = "docx"
    XLSX = "xlsx"
    PPTX = "pptx"
    HTML = "html"
    CSV = "csv"
    JSON = "json"
    JSONL = "jsonl"
    XML = "xml"
    NOTEBOOK = "ipynb"
    EPUB = "epub"
    ZIP = "zip"
    IMAGE = "image"
    AUDIO = "audio"
    TEXT = "text"


SUFFIX_KINDS: dict[str, Kind] = {
    ".pdf": Kind.PDF,
    ".docx": Kind.DOCX,
    ".xlsx": Kind.XLSX,
    ".xlsm": Kind.XLSX,
    ".pptx": Kind.PPTX,
    ".html": Kind.HTML,
    ".htm": Kind.HTML,
    ".xhtml": Kind.HTML,
    ".csv": Kind.CSV,
    ".tsv": Kind.CSV,
    ".json": Kind.JSON,
    ".jsonld": Kind.JSON,
    ".jsonl": Kind.JSONL,
    ".xml": Kind.XML,
    ".ipynb": Kind.NOTEBOOK,
    ".epub": Kind.EPUB,
    ".zip": Kind.ZIP,
    ".png": Kind.IMAGE,
    ".jpg": Kind.IMAGE,
    ".jpeg": Kind.IMAGE,
    ".gif": Kind.IMAGE,
    ".webp": Kind.IMAGE,
    ".mp3": Kind.AUDIO,
    ".wav": Kind.AUDIO,
    ".m4a": Kind.AUDIO,
    ".flac": Kind.AUDIO,
    ".ogg": Kind.AUDIO,
}

MIME_KINDS: dict[str, Kind] = {
    "application/pdf": Kind.PDF,
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": Kind.DOCX,
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": Kind.XLSX,
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": Kind.PPTX,
    "text/html": Kind.HTML,
    "application/xhtml+xml": Kind.HTML,
    "text/csv": Kind.CSV,
    "application/json": Kind.JSON,
    "application/ld+json": Kind.JSON,
    "application/xml": Kind.XML,
    "text/xml": Kind.XML,
    "application/zip": Kind.ZIP,
    "text/plain": Kind.TEXT,
    "text/markdown": Kind.TEXT,
}

ZIP_KINDS = {Kind.DOCX, Kind.XLSX, Kind.PPTX, Kind.EPUB, Kind.ZIP}
# Converted by a parser library (markitdown's readers), so run in a capped process of their own
# (flowllm/tools/web/readerproc.py); a zip may hold any of them.
PARSED_KINDS = {Kind.PDF, Kind.DOCX, Kind.XLSX, Kind.PPTX, Kind.HTML, Kind.NOTEBOOK, Kind.EPUB, Kind.ZIP}
IMAGE_MIME = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}


def kind_of(name: str, mime: str | None = None) -> Kind:
    """The document kind from a file name, else from a MIME type (``read_url``), else plain text."""
    suffix = PurePosixPath(name).suffix.lower()
    if suffix in SUFFIX_KINDS:
        return SUFFIX_KINDS[suffix]
    base = (mime or "").split(";")[0].strip().lower()
    if base in MIME_KINDS:
        return MIME_KINDS[base]
    if base.startswith("image/"):
        return Kind.IMAGE
    if base.startswith("audio/"):
        return Kind.AUDIO
    return Kind.TEXT


def decode_text(data: bytes, charset: str | None = None) -> str:
    """Text from bytes without guessing wildly: BOMs, the declared charset, UTF-8, then Latin-1 (never fails)."""
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8", errors="replace")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    if charset:
        with contextlib.suppress(LookupError, UnicodeDecodeError):
            return data.decode(charset)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace") if b"\x80" in data else data.decode("latin-1")


def looks_binary(data: bytes) -> bool:
    sample = data[:8192]
    if sample.startswith((b"\xff\xfe", b"\xfe\xff")):
        return False  # UTF-16 text has NUL bytes by design
    return b"\x00" in sample


def check_zip(data: bytes, limits: Limits = DEFAULT_LIMITS, what: str = "the file") -> zipfile.ZipFile:
    """Open a zip and refuse it from its directory alone when inflating it would cost too much."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise DocumentError(f"{what} is not a valid zip container ({exc})") from None
    members = archive.infolist()
    if len(members) > limits.max_members:
        raise DocumentError(f"{what} holds {len(members):,} entries, over the limit of {limits.max_members:,}")
    unpacked = sum(m.file_size for m in members)
    packed = max(sum(m.compress_size for m in members), 1)
    if unpacked > limits.max_unpacked_bytes:
        raise DocumentError(
            f"{what} would unpack to {unpacked:,} bytes, over the limit of {limits.max_unpacked_bytes:,} "
            "(a zip bomb, or too large to read here)"
        )
    if unpacked / packed > limits.max_ratio and unpacked > 1024 * 1024:
        raise DocumentError(
            f"{what} is compressed {unpacked / packed:,.0f}:1 ({packed:,} bytes to {unpacked:,}), over the "
            f"{limits.max_ratio:,.0f}:1 limit: refused as a likely zip bomb"
        )
    return archive


def _stream_info(kind: Kind, name: str, charset: str | None = None) -> Any:
    from markitdown import StreamInfo

    suffix = PurePosixPath(name).suffix.lower() or f".{kind.value}"
    return StreamInfo(extension=suffix, filename=PurePosixPath(name).name, charset=charset)


def _markitdown(kind: Kind, data: bytes, name: str, charset: str | None = None) -> str:
    try:
        from markitdown import MissingDependencyException
        from markitdown.converters import (
            DocxConverter,
            EpubConverter,
            HtmlConverter,
            IpynbConverter,
            PdfConverter,
            PptxConverter,
            XlsxConverter,
        )
    except ImportError as exc:
        if importlib.util.find_spec("markitdown") is not None:  # installed, but it would not load here
            raise DocumentError(f"the {kind.value} reader could not be loaded ({type(exc).__name__}: {exc})") from None
        raise DocumentError(
            f"reading {kind.value} documents needs markitdown (pip install 'flowllm[docs]'); "
            "or convert the file with run_python"
        ) from None
    converters: dict[Kind, Any] = {
        Kind.PDF: PdfConverter,
        Kind.DOCX: DocxConverter,
        Kind.XLSX: XlsxConverter,
        Kind.PPTX: PptxConverter,
        Kind.HTML: HtmlConverter,
        Kind.NOTEBOOK: IpynbConverter,
        Kind.EPUB: EpubConverter,
    }
    try:
        result = converters[kind]().convert(io.BytesIO(data), _stream_info(kind, name, charset))
    except MissingDependencyException as exc:
        missing = str(exc).splitlines()[0]
        raise DocumentError(f"a reader for {kind.value} is not installed: {missing}") from None
    except Exception as exc:
        raise DocumentError(f"could not read the {kind.value} document: {type(exc).__name__}: {exc}") from None
    text = (result.markdown or "").strip()
    if kind is Kind.PDF:
        return f"[PDF, {len(data):,} bytes]\n{text}" if text else "[PDF with no extractable text: a scan?]"
    return text


def _csv(data: bytes, name: str) -> str:
    text = decode_text(data)
    delimiter = "\t" if name.lower().endswith(".tsv") else ","
    if delimiter == ",":
        with contextlib.suppress(csv.Error):  # no clear delimiter: keep the comma
            delimiter = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|").delimiter
    try:
        rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    except csv.Error as exc:
        return f"(could not parse as CSV: {exc}; raw text follows)\n{text}"
    columns = max((len(r) for r in rows), default=0)
    sep = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe"}.get(delimiter, repr(delimiter))
    # The raw text, not a markdown table: the model copies exact cells into code, and a table doubles the size.
    return f"[CSV: {len(rows)} rows (including any header row) x {columns} columns, {sep}-separated]\n{text}"


def _json(data: bytes) -> str:
    text = decode_text(data)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"(not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; raw text follows)\n{text}"
    return json.dumps(value, indent=2, ensure_ascii=False)


def _zip(data: bytes, name: str, limits: Limits, depth: int) -> str:
    archive = check_zip(data, limits, f"'{name}'")
    parts = []
    files = [m for m in archive.infolist() if not m.is_dir()]
    parts.append(f"[zip archive '{name}': {len(files)} files]")
    for member in files:
        parts.append(f"\n## {member.filename} ({member.file_size:,} bytes)")
        kind = kind_of(member.filename)
        if kind in (Kind.IMAGE, Kind.AUDIO):
            parts.append(f"({kind.value} file: extract it with run_python to look at it or listen to it)")
            continue
        if kind is Kind.ZIP and depth >= limits.max_depth:
            parts.append("(a zip inside a zip inside a zip: extract it with run_python to read it)")
            continue
        try:
            parts.append(convert(archive.read(member), member.filename, limits=limits, depth=depth + 1))
        except DocumentError as exc:
            parts.append(f"(cannot read this member: {exc})")
        except (zipfile.BadZipFile, RuntimeError, NotImplementedError) as exc:  # encrypted, unknown method
            parts.append(f"(cannot extract this member: {exc})")
    return "\n".join(parts)


def convert(
    data: bytes,
    name: str,
    *,
    mime: str | None = None,
    charset: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    depth: int = 0,
) -> str:
    """``data`` (the bytes of a file called ``name``, or served as ``mime``) as markdown or text.

    Images and audio are not text: the caller shows an image as image content, and points at ``transcribe``
    for audio; here both raise ``DocumentError``.
    """
    if len(data) > limits.max_bytes:
        raise DocumentError(f"it is {len(data):,} bytes, over the {limits.max_bytes:,}-byte limit")
    kind = kind_of(name, mime)
    if kind in ZIP_KINDS and kind is not Kind.ZIP:
        check_zip(data, limits, f"this {kind.value} file")
    if kind is Kind.ZIP:
        return _zip(data, name, limits, depth)
    if kind in (Kind.PDF, Kind.DOCX, Kind.XLSX, Kind.PPTX, Kind.HTML, Kind.NOTEBOOK, Kind.EPUB):
        return _markitdown(kind, data, name, charset)
    if kind is Kind.CSV:
        return _csv(data, name)
    if kind is Kind.JSON:
        return _json(data)
    if kind is Kind.IMAGE:
        raise DocumentError("it is an image: read it with read_file (or ask_image) to see it")
    if kind is Kind.AUDIO:
        raise DocumentError("it is an audio file: use the transcribe tool to hear what it says")
    if looks_binary(data):
        raise DocumentError(f"this is a binary file ({len(data):,} bytes) that cannot be shown as text")
    return decode_text(data, charset)
