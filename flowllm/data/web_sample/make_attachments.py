"""Writes this folder's attachments (run once; the files are committed): python data/web_sample/make_attachments.py

Needs openpyxl and python-docx (both come with ``pip install -e ".[docs]"``).
"""

from __future__ import annotations

import zipfile
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


if __name__ == "__main__":
    workbook()
    archive()
    minutes()
