"""A run of some sections (``python -m benchmarks --only ...``) merged into the results file it would overwrite.

The sections that ran replace those of the same title, each under a note that says when, on what and at which
revision it ran; the Targets table keeps the other sections' rows and takes the new ones in place of theirs; every
other section stays as it was. A section the file did not have yet is added at its end.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from benchmarks.common import Section, md_table

TARGETS = "Targets"
TARGET_HEADERS = ["section", "target", "wanted", "measured", ""]
_HEADING = re.compile(r"(?m)^## ")


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The text before the first ``## `` heading, then each section's title and the text under its heading."""
    head, *parts = _HEADING.split(text)
    sections = []
    for part in parts:
        title, _, body = part.partition("\n")
        sections.append((title.strip(), body))
    return head, sections


def merge_targets(body: str, ran: Sequence[Section]) -> str:
    """The Targets section's table with the rows of ``ran``'s sections replaced by their new targets."""
    lines = body.strip("\n").splitlines()
    table = [line for line in lines if line.startswith("|")]
    if len(table) < 2:  # no table yet: only the new rows
        table = []
    new_rows = {
        section.title: md_table(
            TARGET_HEADERS, [[section.title, t.what, t.target, t.measured, t.verdict] for t in section.targets]
        ).splitlines()
        for section in ran
    }
    header, rows = (table[:2], table[2:]) if table else (md_table(TARGET_HEADERS, []).splitlines()[:2], [])
    kept: list[str] = []
    placed: set[str] = set()
    for row in rows:  # a section's new rows where its old ones were
        title = _row_title(row)
        if title in new_rows:
            if title not in placed:
                kept += new_rows[title][2:]
                placed.add(title)
            continue
        kept.append(row)
    for title, added in new_rows.items():  # a section the table did not have: at its end
        if title not in placed:
            kept += added[2:]
    others = [line for line in lines if not line.startswith("|")]
    before = [line for line in others if line.strip()]
    return "\n" + "\n".join([*before, *([""] if before else []), *header, *kept]) + "\n\n"


def _row_title(row: str) -> str:
    cells = row.strip().strip("|").split("|")
    return cells[0].strip() if cells else ""


def merge_sections(old: str, ran: Sequence[Section], note: str) -> str:
    """``old`` (a results file) with ``ran``'s sections in place of theirs, each under ``note``."""
    head, sections = split_sections(old)
    by_title = {section.title: section for section in ran}
    out: list[str] = [head.rstrip("\n") + "\n\n"]
    done: set[str] = set()

    def rendered(section: Section) -> str:
        _, _, body = section.markdown().partition("\n")
        return f"## {section.title}\n\n{note}\n{body.rstrip(chr(10))}\n\n"

    for title, body in sections:
        if title == TARGETS:
            out.append(f"## {title}\n{merge_targets(body, ran)}")
        elif title in by_title:
            out.append(rendered(by_title[title]))
            done.add(title)
        else:
            out.append(f"## {title}\n{body.rstrip(chr(10))}\n\n")
    out += [rendered(section) for section in ran if section.title not in done]
    return "".join(out).rstrip("\n") + "\n"
