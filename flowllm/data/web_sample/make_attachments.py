"""Writes this folder's attachments (run once; the files are committed): python data/web_sample/make_attachments.py

Needs openpyxl and python-docx (both come with ``pip install -e ".[docs]"``).
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

import docx
import openpyxl

HERE = Path(__file__).resolve().parent


def workbook() -> None:
    book = openpyxl.Workbook()
    first = book.active
    first.title = "Warehouse A"
    for row in (["item", "units"], ["lantern", 14], ["rope (20 m)", 40], ["compass", 6]):
        first.append(row)
    second = book.create_sheet("Warehouse B")
    for row in (["item", "units"], ["tarpaulin", 9], ["lantern", 23], ["compass", 11]):
        second.append(row)
    book.save(HERE / "inventory.xlsx")


def archive() -> None:
    with zipfile.ZipFile(HERE / "expedition.zip", "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr("README.txt", "Expedition accounts, spring 1923. Amounts are in shillings.\n")
        out.writestr("accounts/ledger.csv", "entry,amount\nboat hire,120\nprovisions,85\nlamp oil,17\nguide,60\n")
        out.writestr("accounts/notes.md", "# Notes\nThe guide was paid twice; the ledger lists one payment.\n")


def minutes() -> None:
    document = docx.Document()
    document.add_heading("Gull Island Rowing Club - Annual General Meeting", level=1)
    document.add_paragraph("Held on 12 February 2024 in the boathouse. 31 members attended.")
    document.add_paragraph("Elections: Dana Whitfield was elected treasurer; Omar Reyes remains secretary.")
    table = document.add_table(rows=3, cols=2)
    for r, (office, name) in enumerate(
        (("Office", "Holder"), ("Treasurer", "Dana Whitfield"), ("Secretary", "Omar Reyes"))
    ):
        table.cell(r, 0).text = office
        table.cell(r, 1).text = name
    document.save(str(HERE / "minutes.docx"))


def photo() -> None:
    """A small PNG (a hull with a painted band): the emulator's script says what it shows, by its SHA-256."""
    width, height = 64, 40
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter type: none
        for x in range(width):
            if y < 16:
                pixel = (135, 190, 235)  # sky
            elif 18 <= y <= 24 and 20 <= x <= 44:
                pixel = (250, 250, 250)  # the painted band
            else:
                pixel = (120, 40, 30)  # the hull
            rows += bytes(pixel)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(rows), 9))
    (HERE / "boat.png").write_bytes(png + chunk(b"IEND", b""))


if __name__ == "__main__":
    workbook()
    archive()
    minutes()
    photo()
