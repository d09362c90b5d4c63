"""What the documentation pages state about the code's structure matches the code: the architecture page's layers
are test_import_graph.LAYERS, its package list names every package, and the exit-code table lists every code."""

from __future__ import annotations

import re

from flowllm.exit_codes import ExitCode
from tests.manual import ROOT, page
from tests.test_import_graph import LAYERS

NOT_PACKAGES = {"__main__", "data"}  # in LAYERS for the import check; no layer of their own on the page


def _block_after(text: str, heading: str) -> list[str]:
    """The lines of the first fenced block after ``heading``."""
    after = text.split(heading, 1)[1]
    return after.split("```text\n", 1)[1].split("```", 1)[0].splitlines()


def test_the_architecture_page_draws_the_layers_of_the_import_check() -> None:
    drawn = []
    for line in _block_after(page("concepts/architecture.md"), "## Layers"):
        if line.startswith(" "):
            continue  # a description's second line
        names = []
        for word in re.split(r" {2,}", line.strip()):
            if " " in word:
                break  # the description
            names.append(word)
        drawn.append(tuple(names))
    expected = [tuple(p for p in layer if p not in NOT_PACKAGES) for layer in reversed(LAYERS)]
    assert drawn == expected


def test_the_architecture_page_names_every_package() -> None:
    listed = {
        line.split()[0].removeprefix("flowllm/").removesuffix(".py")
        for line in _block_after(page("concepts/architecture.md"), "## Packages")
        if line.startswith("flowllm/")
    }
    packages = {p.name for p in (ROOT / "flowllm").iterdir() if (p / "__init__.py").is_file()}
    assert packages - listed == set()


def test_the_exit_code_table_lists_every_code() -> None:
    rows = re.findall(r"^\| (\d+) \|", page("reference/exit-codes.md"), re.MULTILINE)
    assert {int(code) for code in rows} == {int(code) for code in ExitCode}
