"""Every attachment type GAIA ships, generated here with the real libraries, read through ``read_file``; and the
guards that run before any reader: zip bombs, FIFOs, devices, hard links."""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.server.mcpserver.exceptions import ToolError

from flowllm.tools.files import read_file_result
from flowllm.tools.web.documents import DocumentError, Limits, check_zip, convert, decode_text

pytest.importorskip("markitdown")


def text_of(result) -> str:
    return "\n".join(item.text for item in result.content if item.type == "text")


def make_pdf(path: Path, lines: list[str]) -> None:
    fpdf = pytest.importorskip("fpdf")
    pdf = fpdf.FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    for line in lines:
        pdf.cell(0, 10, line, new_x="LMARGIN", new_y="NEXT")
    pdf.output(str(path))


def make_xlsx(path: Path) -> None:
    openpyxl = pytest.importorskip("openpyxl")
    book = openpyxl.Workbook()
    first = book.active
    first.title = "Sales"
    first.append(["item", "qty"])
    first.append(["apple", 3])
    first.append(["pear", 5])
    second = book.create_sheet("Staff")
    second.append(["name", "role"])
    second.append(["Ada", "engineer"])
    book.save(path)


def make_docx(path: Path) -> None:
    docx = pytest.importorskip("docx")
    document = docx.Document()
    document.add_heading("Quarterly report", level=1)
    document.add_paragraph("Revenue grew by 12 percent.")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "region"
    table.cell(0, 1).text = "units"
    table.cell(1, 0).text = "North"
    table.cell(1, 1).text = "42"
    document.save(str(path))


def make_pptx(path: Path) -> None:
    pptx = pytest.importorskip("pptx")
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Launch plan"
    slide.placeholders[1].text = "Ship on the third of May"
    deck.save(str(path))


def test_pdf(workspace: Path) -> None:
    make_pdf(workspace / "report.pdf", ["The bridge is 1,280 metres long.", "Opened in 1937."])
    text = text_of(read_file_result(workspace, "report.pdf"))
    assert text.startswith("[PDF,")
    assert "1,280 metres" in text and "1937" in text


def test_xlsx_every_sheet_is_a_table(workspace: Path) -> None:
    make_xlsx(workspace / "book.xlsx")
    text = text_of(read_file_result(workspace, "book.xlsx"))
    assert "## Sales" in text and "## Staff" in text
    assert "| apple | 3 |" in text and "| Ada | engineer |" in text
    assert text.index("## Sales") < text.index("## Staff")


def test_docx_keeps_headings_and_tables(workspace: Path) -> None:
    make_docx(workspace / "report.docx")
    text = text_of(read_file_result(workspace, "report.docx"))
    assert "# Quarterly report" in text
    assert "Revenue grew by 12 percent." in text
    assert "North" in text and "42" in text and "|" in text


def test_pptx(workspace: Path) -> None:
    make_pptx(workspace / "deck.pptx")
    text = text_of(read_file_result(workspace, "deck.pptx"))
    assert "Launch plan" in text and "Ship on the third of May" in text


def test_html_xml_jsonld_markdown_and_code(workspace: Path) -> None:
    (workspace / "page.html").write_text(
        "<html><head><style>p{}</style><script>var x=1</script></head>"
        "<body><h1>Title</h1><p>Some <b>bold</b> text.</p></body></html>"
    )
    (workspace / "data.xml").write_text('<?xml version="1.0"?><root><item id="1">alpha</item></root>')
    (workspace / "meta.jsonld").write_text('{"@context": "https://schema.org", "name": "Thing"}')
    (workspace / "notes.md").write_text("# Notes\n- one\n")
    (workspace / "script.py").write_text("print('hi')\n")
    html = text_of(read_file_result(workspace, "page.html"))
    assert "# Title" in html and "**bold**" in html and "var x" not in html
    assert '<item id="1">alpha</item>' in text_of(read_file_result(workspace, "data.xml"))
    assert json.loads(text_of(read_file_result(workspace, "meta.jsonld")))["name"] == "Thing"
    assert text_of(read_file_result(workspace, "notes.md")) == "# Notes\n- one\n"
    assert text_of(read_file_result(workspace, "script.py")) == "print('hi')\n"


def test_zip_members_are_each_read(workspace: Path) -> None:
    make_xlsx(workspace / "inner.xlsx")
    with zipfile.ZipFile(workspace / "bundle.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("readme.txt", "the code is 7731")
        archive.writestr("data/prices.csv", "item,price\ntea,2.5\n")
        archive.write(workspace / "inner.xlsx", "inner.xlsx")
        archive.writestr("photo.png", b"\x89PNG\r\n\x1a\n")
    text = text_of(read_file_result(workspace, "bundle.zip"))
    assert text.startswith("[zip archive 'bundle.zip': 4 files]")
    assert "the code is 7731" in text
    assert "## data/prices.csv" in text and "tea,2.5" in text
    assert "| apple | 3 |" in text
    assert "photo.png" in text and "extract it with run_python" in text


def test_a_corrupt_office_file_is_a_clear_error(workspace: Path) -> None:
    (workspace / "book.xlsx").write_bytes(b"PK\x03\x04 not really a workbook")
    with pytest.raises(ToolError, match=r"cannot read 'book.xlsx': this xlsx file is not a valid zip"):
        read_file_result(workspace, "book.xlsx")


def _bomb(members: int, size: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        for n in range(members):
            archive.writestr(f"xl/worksheets/sheet{n}.xml", b"\x00" * size)
    return buffer.getvalue()


def test_an_xlsx_zip_bomb_is_refused_before_any_reader_runs(workspace: Path) -> None:
    data = _bomb(1, 24 * 1024 * 1024)  # ~24 KB on disk, ~1000:1 like the 230 KB bomb of the report
    assert len(data) < 64 * 1024
    (workspace / "bomb.xlsx").write_bytes(data)
    with pytest.raises(ToolError, match=r"cannot read 'bomb.xlsx': this xlsx file is compressed [\d,]+:1"):
        read_file_result(workspace, "bomb.xlsx")


def test_the_unpacked_total_and_member_count_are_limited() -> None:
    with pytest.raises(DocumentError, match=r"would unpack to 4,194,3.. bytes, over the limit of 1,048,576"):
        check_zip(_bomb(4, 1024 * 1024), Limits(max_unpacked_bytes=1024 * 1024))
    with pytest.raises(DocumentError, match="holds 4 entries, over the limit of 3"):
        check_zip(_bomb(3, 10), Limits(max_members=3))


def test_a_fifo_is_refused_at_once_without_a_thread(workspace: Path) -> None:
    os.mkfifo(workspace / "pipe.txt")
    threads = threading.active_count()
    with pytest.raises(ToolError, match="it is a FIFO, not a regular file"):
        read_file_result(workspace, "pipe.txt")
    assert threading.active_count() == threads


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_link_to_a_device_is_refused(workspace: Path) -> None:
    # confine() refuses the symlink itself (it points outside); a device node inside is refused by type.
    (workspace / "zero").symlink_to("/dev/zero")
    with pytest.raises(ToolError, match="outside the task folder"):
        read_file_result(workspace, "zero")


def test_a_hard_link_is_refused(workspace: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0")
    os.link(secret, workspace / "innocent.txt")
    with pytest.raises(ToolError, match=r"hard link .* refused"):
        read_file_result(workspace, "innocent.txt")


def test_non_utf8_text_is_decoded() -> None:
    assert decode_text("café".encode("cp1252")) == "café"
    assert decode_text("naïve".encode("utf-16")) == "naïve"
    assert decode_text("Ümlaut".encode("iso-8859-1"), "iso-8859-1") == "Ümlaut"


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=2048), st.sampled_from(["x.zip", "x.xlsx", "x.docx", "x.pdf", "x.json", "x.csv", "x"]))
def test_any_bytes_convert_or_fail_cleanly(data: bytes, name: str) -> None:
    try:
        assert isinstance(convert(data, name), str)
    except DocumentError as exc:
        assert str(exc)
