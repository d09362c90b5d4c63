"""tool-files' logic: confinement to the task folder, formats, paging, listings (in-process; the stdio path is
covered in test_builtin_servers)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from flowllm.tools.common import ConfinementError, confine
from flowllm.tools.files import list_files_text, read_file_result


def text_of(result) -> str:
    return "\n".join(item.text for item in result.content if item.type == "text")


@pytest.fixture
def attachments(workspace: Path, tmp_path: Path) -> Path:
    (workspace / "notes.txt").write_text("hello\nworld\n")
    (workspace / "table.csv").write_text("name,qty\napple,3\npear,5\n")
    (workspace / "data.json").write_text('{"b": 1, "a": [1, 2]}')
    (workspace / "sub").mkdir()
    (workspace / "sub" / "inner.txt").write_text("inside")
    (workspace / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    outside = tmp_path / "secret.txt"
    outside.write_text("top secret")
    (workspace / "escape").symlink_to(outside)
    (workspace / "inner-link").symlink_to(workspace / "sub" / "inner.txt")
    return workspace


@pytest.mark.parametrize("path", ["../secret.txt", "sub/../../secret.txt", "/etc/passwd", "escape"])
def test_paths_leaving_the_folder_are_refused(attachments: Path, path: str) -> None:
    with pytest.raises(ToolError, match="outside the task folder"):
        read_file_result(attachments, path)


def test_the_refusal_never_shows_the_absolute_workspace_path(attachments: Path) -> None:
    with pytest.raises(ToolError) as info:
        read_file_result(attachments, str(attachments / ".." / "secret.txt"))
    assert str(attachments) not in str(info.value)


def test_absolute_paths_inside_the_folder_and_inner_links_are_fine(attachments: Path) -> None:
    assert text_of(read_file_result(attachments, str(attachments / "notes.txt"))) == "hello\nworld\n"
    assert text_of(read_file_result(attachments, "inner-link")) == "inside"
    assert confine(attachments, "./sub/inner.txt") == (attachments / "sub" / "inner.txt").resolve()
    with pytest.raises(ConfinementError):
        confine(attachments, "bad\x00name")


def test_csv_gets_a_shape_line_and_json_is_pretty_printed(attachments: Path) -> None:
    table = text_of(read_file_result(attachments, "table.csv"))
    assert table.splitlines()[0] == "[CSV: 3 rows (including any header row) x 2 columns, comma-separated]"
    assert "apple,3" in table
    data = text_of(read_file_result(attachments, "data.json"))
    assert json.loads(data) == {"b": 1, "a": [1, 2]}
    assert data.startswith('{\n  "b": 1')


def test_missing_files_folders_and_binaries_get_clear_errors(attachments: Path) -> None:
    with pytest.raises(ToolError, match=r"no such file: 'nope.txt'.*notes.txt"):
        read_file_result(attachments, "nope.txt")
    with pytest.raises(ToolError, match="is a folder; use list_files"):
        read_file_result(attachments, "sub")
    with pytest.raises(ToolError, match="binary file"):
        read_file_result(attachments, "blob.bin")


def test_long_files_come_in_pages(attachments: Path) -> None:
    (attachments / "long.txt").write_text("0123456789" * 5)
    first = text_of(read_file_result(attachments, "long.txt", 0, page_chars=20))
    assert (
        first == "01234567890123456789\n[showing characters 0-20 of 50; call read_file again with offset=20 for more]"
    )
    last = text_of(read_file_result(attachments, "long.txt", 40, page_chars=20))
    assert last == "0123456789\n[showing characters 40-50 of 50; end of file]"
    with pytest.raises(ToolError, match="past the end"):
        read_file_result(attachments, "long.txt", 60, page_chars=20)


def test_images_come_back_as_image_content(attachments: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
    (attachments / "chart.png").write_bytes(png)
    result = read_file_result(attachments, "chart.png")
    kinds = [item.type for item in result.content]
    assert kinds == ["text", "image"]
    assert result.content[1].mime_type == "image/png"


def test_listing_is_sorted_relative_and_marks_links(attachments: Path) -> None:
    listing = list_files_text(attachments).splitlines()
    assert listing == [
        "blob.bin  9 bytes",
        "data.json  21 bytes",
        "escape  (symbolic link pointing outside the task folder: not readable)",
        "inner-link -> sub/inner.txt  (symbolic link)",
        "notes.txt  12 bytes",
        "sub/",
        "sub/inner.txt  6 bytes",
        "table.csv  24 bytes",
    ]
    assert list_files_text(attachments, "sub") == "sub/inner.txt  6 bytes"
    with pytest.raises(ToolError, match="outside the task folder"):
        list_files_text(attachments, "..")


def test_an_empty_folder_says_so(workspace: Path) -> None:
    assert list_files_text(workspace) == "(the task folder is empty)"
    os.mkdir(workspace / "empty")
    assert list_files_text(workspace, "empty") == "('empty' is empty)"
