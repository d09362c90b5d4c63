"""``tool-files``: an MCP server (stdio) with ``read_file(path, offset)`` and ``list_files(path)``.

Run it as ``python -m flowllm.tools.files [--workspace DIR]``. Both tools are confined to the task's folder:
``..``, absolute paths elsewhere and symbolic links that point out are refused with a clear error. Paths in
results are relative to the folder, so two runs in different folders answer identically.

Formats: text (UTF-8, UTF-16 with a BOM, else Latin-1), CSV/TSV (with a shape line), JSON (pretty-printed);
images come back as image content; ``.xlsx``, ``.pdf`` and ``.docx`` are read with ``openpyxl``, ``pypdf`` and
``python-docx`` when those optional packages are installed (the error says which one to install otherwise).
Long files are served in pages of ``--page-chars`` characters; the note at the end says how to read on.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import io
import json
import mimetypes
import stat
from collections.abc import Callable
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ImageContent, TextContent

from flowllm.tools.common import (
    ConfinementError,
    add_workspace_argument,
    confine,
    relative_display,
    scrub_workspace,
    workspace_from,
)

SERVER_NAME = "tool-files"
DEFAULT_PAGE_CHARS = 16000  # below the pool's default 20,000-character cut, so the paging note survives
MAX_LIST_ENTRIES = 500
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_READ_BYTES = 64 * 1024 * 1024  # larger files are refused: read them with run_python instead

IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}


class ReadError(Exception):
    """A file that exists but cannot be shown (missing optional reader, corrupt document...)."""


def decode_text(data: bytes) -> str:
    """Text from bytes without guessing wildly: BOMs first, then UTF-8, then Latin-1 (never fails)."""
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8", errors="replace")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def looks_binary(data: bytes) -> bool:
    sample = data[:8192]
    if sample.startswith((b"\xff\xfe", b"\xfe\xff")):
        return False  # UTF-16 text has NUL bytes by design
    return b"\x00" in sample


def _read_csv(data: bytes, suffix: str) -> str:
    text = decode_text(data)
    delimiter = "\t" if suffix == ".tsv" else ","
    if suffix != ".tsv":
        with contextlib.suppress(csv.Error):  # no clear delimiter: keep the comma
            delimiter = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|").delimiter
    try:
        rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    except csv.Error as exc:
        return f"(could not parse as CSV: {exc}; raw text follows)\n{text}"
    columns = max((len(r) for r in rows), default=0)
    sep = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe"}.get(delimiter, repr(delimiter))
    header = f"[CSV: {len(rows)} rows (including any header row) x {columns} columns, {sep}-separated]"
    return f"{header}\n{text}"


def _read_json(data: bytes, suffix: str) -> str:
    text = decode_text(data)
    if suffix == ".jsonl":
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"(not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; raw text follows)\n{text}"
    return json.dumps(value, indent=2, ensure_ascii=False)


def _read_xlsx(path: Path) -> str:
    try:
        import openpyxl
    except ImportError:
        raise ReadError(
            "reading .xlsx files needs the optional package 'openpyxl' (pip install openpyxl); "
            "or convert the file with run_python"
        ) from None
    try:
        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except Exception as exc:
        raise ReadError(f"could not open the workbook: {exc}") from None
    parts: list[str] = []
    try:
        for sheet in book.worksheets:
            rows = [["" if v is None else str(v) for v in row] for row in sheet.iter_rows(values_only=True)]
            while rows and not any(rows[-1]):
                rows.pop()
            width = max((len(r) for r in rows), default=0)
            parts.append(f"## Sheet '{sheet.title}' ({len(rows)} rows x {width} columns)")
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\n")
            for row in rows:
                writer.writerow(row)
            parts.append(buffer.getvalue().rstrip("\n"))
    finally:
        book.close()
    return "\n".join(parts)


def _read_pdf(path: Path) -> str:
    try:
        import pypdf
    except ImportError:
        raise ReadError("reading .pdf files needs the optional package 'pypdf' (pip install pypdf)") from None
    try:
        reader = pypdf.PdfReader(str(path))
        pages = [f"--- page {i} ---\n{(page.extract_text() or '').strip()}" for i, page in enumerate(reader.pages, 1)]
    except Exception as exc:
        raise ReadError(f"could not read the PDF: {exc}") from None
    return f"[PDF: {len(pages)} pages]\n" + "\n".join(pages)


def _read_docx(path: Path) -> str:
    try:
        import docx
    except ImportError:
        raise ReadError(
            "reading .docx files needs the optional package 'python-docx' (pip install python-docx)"
        ) from None
    try:
        document = docx.Document(str(path))
    except Exception as exc:
        raise ReadError(f"could not open the document: {exc}") from None
    parts = [p.text for p in document.paragraphs]
    for n, table in enumerate(document.tables, 1):
        parts.append(f"## Table {n}")
        parts.extend(" | ".join(cell.text for cell in row.cells) for row in table.rows)
    return "\n".join(parts)


DOCUMENT_READERS: dict[str, Callable[[Path], str]] = {
    ".xlsx": _read_xlsx,
    ".xlsm": _read_xlsx,
    ".pdf": _read_pdf,
    ".docx": _read_docx,
}


def render_file(path: Path) -> str | tuple[str, bytes]:
    """The file as text, or ``(mime type, bytes)`` for an image. Raises ``ReadError`` when it cannot."""
    suffix = path.suffix.lower()
    size = path.stat().st_size
    if suffix in DOCUMENT_READERS:
        return DOCUMENT_READERS[suffix](path)
    if suffix in IMAGE_TYPES:
        if size > MAX_IMAGE_BYTES:
            raise ReadError(f"the image is {size:,} bytes, over the {MAX_IMAGE_BYTES:,}-byte limit")
        return IMAGE_TYPES[suffix], path.read_bytes()
    if size > MAX_READ_BYTES:
        raise ReadError(f"the file is {size:,} bytes, too large to read here; process it with run_python instead")
    data = path.read_bytes()
    if suffix in (".csv", ".tsv"):
        return _read_csv(data, suffix)
    if suffix in (".json", ".jsonl"):
        return _read_json(data, suffix)
    if looks_binary(data):
        kind = mimetypes.guess_type(path.name)[0] or "unknown type"
        raise ReadError(
            f"this is a binary file ({kind}, {size:,} bytes) that cannot be shown as text; "
            "inspect it with run_python if needed"
        )
    return decode_text(data)


def page(text: str, offset: int, page_chars: int) -> str:
    """One page of ``text`` with a note saying what was shown and how to get the rest."""
    total = len(text)
    if offset >= total and total > 0:
        raise ToolError(f"offset {offset} is past the end of the file ({total:,} characters)")
    end = min(total, offset + page_chars)
    chunk = text[offset:end]
    if offset == 0 and end == total:
        return chunk
    note = f"[showing characters {offset:,}-{end:,} of {total:,}"
    note += f"; call read_file again with offset={end} for more]" if end < total else "; end of file]"
    return f"{chunk}\n{note}"


def _file_error(workspace: Path, shown: str, target: Path | None = None) -> ToolError:
    # Suggest what *is* there, next to where the model looked: the usual fix is a typo or a wrong folder.
    folder = target.parent if target is not None and target.parent.is_dir() else workspace
    entries = sorted(folder.iterdir(), key=lambda p: p.name)[:20] if folder.is_dir() else []
    names = [relative_display(p, workspace) + ("/" if p.is_dir() else "") for p in entries]
    where = (
        "the task folder" if folder.resolve() == workspace.resolve() else f"'{relative_display(folder, workspace)}/'"
    )
    hint = f" Files in {where}: {', '.join(names)}." if names else f" {where.capitalize()} is empty."
    return ToolError(scrub_workspace(f"no such file: '{shown}'.{hint}", workspace))


def read_file_result(
    workspace: Path, path: str, offset: int = 0, page_chars: int = DEFAULT_PAGE_CHARS
) -> CallToolResult:
    try:
        target = confine(workspace, path)
    except ConfinementError as exc:
        raise ToolError(scrub_workspace(str(exc), workspace)) from None
    shown = relative_display(target, workspace)
    if not target.exists():
        raise _file_error(workspace, path, target)
    if target.is_dir():
        raise ToolError(f"'{shown}' is a folder; use list_files to see what it contains")
    if offset < 0:
        raise ToolError("offset must be 0 or more")
    try:
        rendered = render_file(target)
    except ReadError as exc:
        raise ToolError(f"cannot read '{shown}': {exc}") from None
    except OSError as exc:
        raise ToolError(f"cannot read '{shown}': {exc.strerror or exc}") from None
    if isinstance(rendered, tuple):
        mime, data = rendered
        return CallToolResult(
            content=[
                TextContent(type="text", text=f"[image '{shown}', {mime}, {len(data):,} bytes]"),
                ImageContent(type="image", data=base64.b64encode(data).decode("ascii"), mime_type=mime),
            ]
        )
    text = scrub_workspace(rendered, workspace)
    return CallToolResult(content=[TextContent(type="text", text=page(text, offset, page_chars))])


def list_files_text(workspace: Path, path: str = ".") -> str:
    try:
        root = confine(workspace, path)
    except ConfinementError as exc:
        raise ToolError(scrub_workspace(str(exc), workspace)) from None
    if not root.exists():
        raise _file_error(workspace, path, root)
    if not root.is_dir():
        return f"{relative_display(root, workspace)}  {root.stat().st_size:,} bytes (a file, not a folder)"
    lines: list[str] = []
    total = 0
    # Depth first, sorted, so a folder's contents follow the folder: the listing reads like a tree.
    pending: list[list[Path]] = [sorted(root.iterdir(), key=lambda p: p.name)]
    while pending:
        if not pending[-1]:
            pending.pop()
            continue
        full = pending[-1].pop(0)
        total += 1
        if len(lines) < MAX_LIST_ENTRIES:
            lines.append(_describe_entry(full, workspace))
        # Symlinked folders are described, not walked: their target may be anywhere.
        if full.is_dir() and not full.is_symlink():
            try:
                children = sorted(full.iterdir(), key=lambda p: p.name)
            except OSError:
                children = []
            pending.append(children)
    if not lines:
        where = "the task folder" if root == workspace.resolve() else f"'{relative_display(root, workspace)}'"
        return f"({where} is empty)"
    if total > len(lines):
        lines.append(f"[... {total - len(lines):,} more entries not shown; list a subfolder to see them]")
    return "\n".join(lines)


def _describe_entry(full: Path, workspace: Path) -> str:
    shown = relative_display(full.parent, workspace)
    rel = full.name if shown == "." else f"{shown}/{full.name}"
    info = full.lstat()
    if stat.S_ISLNK(info.st_mode):
        try:
            target = confine(workspace, str(full))
            return f"{rel} -> {relative_display(target, workspace)}  (symbolic link)"
        except ConfinementError:
            return f"{rel}  (symbolic link pointing outside the task folder: not readable)"
    if stat.S_ISDIR(info.st_mode):
        return f"{rel}/"
    return f"{rel}  {info.st_size:,} bytes"


def build_server(workspace: Path, page_chars: int = DEFAULT_PAGE_CHARS) -> MCPServer:
    server = MCPServer(SERVER_NAME, instructions="Reads the task's files.", log_level="WARNING")

    def read_file(path: str, offset: int = 0) -> CallToolResult:
        return read_file_result(workspace, path, offset, page_chars)

    def list_files(path: str = ".") -> str:
        return list_files_text(workspace, path)

    server.add_tool(
        read_file,
        name="read_file",
        description=(
            "Read a file from the task's folder. 'path' is relative to that folder (e.g. 'data.csv' or "
            "'docs/report.pdf'). Text, CSV, JSON, and (when the readers are installed) .xlsx, .pdf and .docx "
            "are returned as text; images are returned as images. Long files come in pages of "
            f"{page_chars:,} characters: pass 'offset' (a character position) to read further."
        ),
    )
    server.add_tool(
        list_files,
        name="list_files",
        description=(
            "List the files and folders in the task's folder (or in a subfolder given by 'path'), "
            "recursively, "
            "with sizes. Folders end with '/'. Paths are relative to the task's folder."
        ),
        structured_output=False,
    )
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flowllm.tools.files", description=__doc__)
    add_workspace_argument(parser)
    parser.add_argument("--page-chars", type=int, default=DEFAULT_PAGE_CHARS, help="characters per read_file page")
    args = parser.parse_args(argv)
    build_server(workspace_from(args.workspace), args.page_chars).run()


if __name__ == "__main__":
    main()
