"""``tool-files``: an MCP server (stdio) with ``read_file(path, offset)`` and ``list_files(path)``.

Run it as ``python -m flowllm.tools.files [--workspace DIR]``. Both tools are confined to the task's folder:
``..``, absolute paths elsewhere and symbolic links that point out are refused with a clear error. Paths in
results are relative to the folder, so two runs in different folders answer identically.

Formats (``flowllm.tools.web.documents``): PDF, Word, Excel (every sheet as a table), PowerPoint, HTML, notebooks
and EPUB through markitdown; zip archives member by member; CSV/TSV with a shape line; JSON/JSON-LD
pretty-printed; XML, Markdown, code and other text as is; images come back as image content. Only regular
files with one link are read (no FIFOs, devices or hard links), and zip containers are measured before any
reader inflates them. Long files are served in pages of ``--page-chars`` characters; the note at the end says
how to read on.
"""

from __future__ import annotations

import argparse
import base64
import os
import stat
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ImageContent, TextContent

from flowllm.core.types import InfraCause
from flowllm.tools.common import (
    ConfinementError,
    add_workspace_argument,
    confine,
    relative_display,
    scrub_workspace,
    workspace_from,
)
from flowllm.tools.needs import DOCUMENT_NEEDS, infra_meta, limited_meta, unmet
from flowllm.tools.taskfolder import TaskFolders, asks_for_workspace
from flowllm.tools.web.documents import (
    DEFAULT_LIMITS,
    IMAGE_MIME,
    PARSED_KINDS,
    DocumentError,
    Kind,
    Limits,
    convert,
    kind_of,
)
from flowllm.tools.web.readerproc import ReaderLimits, ReaderProcess

SERVER_NAME = "tool-files"
DEFAULT_PAGE_CHARS = 16000  # below the pool's default 20,000-character cut, so the paging note survives
MAX_LIST_ENTRIES = 500
MAX_IMAGE_BYTES = 5 * 1024 * 1024


class ReadError(Exception):
    """A file that exists but cannot be shown (not a regular file, over a limit, corrupt document...)."""


def open_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, refusing anything but a plain file of this workspace.

    FIFOs and devices are refused from ``stat`` before any ``open`` (opening a FIFO blocks until a writer comes;
    a device may never end), and the descriptor is opened non-blocking and checked again with ``fstat`` so a
    file swapped for a FIFO between the two calls cannot block either. A hard link (``st_nlink > 1``) is
    refused: code run by the model can ``os.link('/etc/passwd', 'x')`` inside the workspace, and neither the
    owner (root on both sides in a container) nor the device (the same filesystem) tells such a link from a
    real attachment, while the run itself copies attachments (one link each).
    """
    info = path.stat()
    _check_regular(info)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        _check_regular(info)
        if info.st_size > max_bytes:
            raise ReadError(
                f"the file is {info.st_size:,} bytes, too large to read here; process it with run_python instead"
            )
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(max_bytes + 1)[:max_bytes]
    finally:
        os.close(fd)


def _check_regular(info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device or socket"
        raise ReadError(f"it is {kind}, not a regular file: only plain files are read")
    if info.st_nlink > 1:
        raise ReadError(
            f"it is a hard link ({info.st_nlink} names for one file): refused, since it may point at a file "
            "outside the task folder; copy the file instead of linking it"
        )


def render_file(
    path: Path, limits: Limits = DEFAULT_LIMITS, reader: ReaderProcess | None = None
) -> str | tuple[str, bytes]:
    """The file as text, or ``(mime type, bytes)`` for an image. Raises ``ReadError`` when it cannot.
    ``reader``: where documents that need a parser library are converted (a capped process of its own)."""
    kind = kind_of(path.name)
    cap = MAX_IMAGE_BYTES if kind is Kind.IMAGE else limits.max_bytes
    data = open_regular(path, cap)
    if kind is Kind.IMAGE:
        return IMAGE_MIME[path.suffix.lower()], data
    try:
        if reader is not None and kind in PARSED_KINDS:
            return reader.run(convert, data, path.name, limits=limits)
        return convert(data, path.name, limits=limits)
    except DocumentError as exc:
        raise ReadError(str(exc)) from None


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
    workspace: Path,
    path: str,
    offset: int = 0,
    page_chars: int = DEFAULT_PAGE_CHARS,
    reader: ReaderProcess | None = None,
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
        rendered = render_file(target, reader=reader)
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


def build_server(
    workspace: Path | None,
    page_chars: int = DEFAULT_PAGE_CHARS,
    reader_limits: ReaderLimits | None = None,
    readers: int = 2,
    limited: str | None = None,
) -> MCPServer:
    """The ``tool-files`` server. ``workspace``: the folder of the task it serves; ``None`` for a server shared by
    a run, whose calls each name their task's folder (``flowllm.tools.taskfolder``). ``readers``: documents
    parsed at once (each in a capped process of its own, started on first use). ``limited``: why documents
    (PDF, office files, HTML...) cannot be read here; read_file is still offered for the other files, and its
    listing says what it cannot do (``flowllm.tools.needs``)."""
    server = MCPServer(SERVER_NAME, instructions="Reads the task's files.", log_level="WARNING")
    folders = TaskFolders(SERVER_NAME, workspace)
    reader = ReaderProcess(reader_limits, workers=readers)
    reader.warn_if_not_isolated(SERVER_NAME)

    def read_file(ctx: Context, path: str, offset: int = 0) -> CallToolResult:
        if limited and kind_of(path) in PARSED_KINDS - {Kind.ZIP}:
            # A document this install cannot read: the machine's failure, counted apart from the model's.
            return CallToolResult(
                content=[TextContent(type="text", text=f"cannot read '{path}' here: {limited}")],
                is_error=True,
                _meta=infra_meta(InfraCause.UNAVAILABLE),
            )
        return read_file_result(folders.for_call(ctx), path, offset, page_chars, reader)

    def list_files(ctx: Context, path: str = ".") -> str:
        return list_files_text(folders.for_call(ctx), path)

    formats = (
        "CSV, JSON, XML, zip archives (every member) and text"
        if limited
        else "PDF, Word, Excel (every sheet), PowerPoint, HTML, CSV, JSON, XML, zip archives (every member) and text"
    )
    server.add_tool(
        read_file,
        name="read_file",
        meta={**asks_for_workspace(), **(limited_meta(limited) if limited else {})},
        description=(
            "Read a file from the task's folder. 'path' is relative to that folder (e.g. 'data.csv' or "
            f"'docs/notes.txt'). {formats} are returned as text or markdown; images are returned as images. "
            "Long files come in pages of "
            f"{page_chars:,} characters: pass 'offset' (a character position) to read further."
        ),
    )
    server.add_tool(
        list_files,
        name="list_files",
        meta=asks_for_workspace(),
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
    defaults = ReaderLimits()
    parser.add_argument("--reader-memory-mb", type=int, default=defaults.memory_mb, help="document reader's cap")
    parser.add_argument("--reader-timeout-s", type=float, default=defaults.timeout_s, help="per document")
    parser.add_argument("--readers", type=int, default=2, help="documents parsed at once (one process each)")
    args = parser.parse_args(argv)
    limits = ReaderLimits(args.reader_memory_mb, args.reader_timeout_s)
    limited = unmet(DOCUMENT_NEEDS, "reading pdf, docx, xlsx, pptx, html, ipynb and epub files")
    build_server(workspace_from(args.workspace), args.page_chars, limits, args.readers, limited).run()


if __name__ == "__main__":
    main()
