"""The install: every module a built-in tool server needs imports for real in a dev install (CI runs this file
alone in a venv made by the README's plain command, unpinned, with the pip ``python3 -m venv`` gives), and
constraints.txt pins a version inside every range pyproject.toml asks for."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flowllm.tools.needs import PAGE_NEEDS, TRANSCRIPTION_NEEDS, absent_modules

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("need", [*PAGE_NEEDS, *TRANSCRIPTION_NEEDS], ids=lambda need: need.module)
def test_every_module_a_builtin_tool_needs_imports(need) -> None:
    # A real import, even for the needs the servers only look up at start: a broken install must fail here.
    importlib.import_module(need.module)


def test_the_servers_own_check_finds_nothing_missing() -> None:
    assert absent_modules([*PAGE_NEEDS, *TRANSCRIPTION_NEEDS]) == []


def test_trafilatura_reads_a_page() -> None:
    # What tool-browse does with a page; fails when lxml.html.clean is missing (lxml_html_clean not installed).
    import trafilatura

    html = "<html><body><nav>menu</nav><article><h1>Tower</h1><p>The tower is 38 m tall.</p></article></body></html>"
    assert "38 m" in (trafilatura.extract(html, favor_recall=True) or "")


def pinned() -> dict[str, str]:
    text = (ROOT / "constraints.txt").read_text()
    return {
        canonicalize_name(m.group(1)): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9._-]+)==([^\s;]+)", text, re.MULTILINE)
    }


def test_constraints_pin_every_requirement_inside_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]
    pins = pinned()
    wrong = [
        f"{req} (pinned {pins.get(canonicalize_name(req.name), 'nowhere')})"
        for req in wanted
        if not req.specifier.contains(pins.get(canonicalize_name(req.name), ""), prereleases=True)
    ]
    where = "docs/getting-started.md, 'Reproducible installs'"
    assert not wrong, f"regenerate constraints.txt ({where}): " + "; ".join(wrong)
    assert "lxml-html-clean" in pins


def test_constraints_name_no_index_and_no_extras() -> None:
    # pip refuses extras in a constraints file; an index URL or a path would tie it to one machine.
    text = (ROOT / "constraints.txt").read_text()
    lines = [line for line in text.splitlines() if line and not line.lstrip().startswith("#")]
    assert all("[" not in line and "://" not in line and not line.startswith("-") for line in lines)
