"""The manual as the tests read it: the README and the documentation site's pages (docs/, built by mkdocs.yml).

Tests that check what the manual says read the page the content lives on, or every page at once.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def manual_pages() -> list[Path]:
    """The README, then every Markdown page of the site, in name order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page(name: str) -> str:
    """One page of the site, by its path under docs/ (``guides/exports.md``)."""
    return (DOCS / name).read_text(encoding="utf-8")


def manual_text() -> str:
    """Every page of the manual, one after another."""
    return "\n".join(path.read_text(encoding="utf-8") for path in manual_pages())


def manual_lines() -> list[tuple[str, int, str]]:
    """(page, line number, line) of every line of the manual; the page named from the repository root."""
    return [
        (str(path.relative_to(ROOT)), number, line)
        for path in manual_pages()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
    ]
