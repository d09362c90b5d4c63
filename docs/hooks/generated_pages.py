"""An mkdocs hook (mkdocs.yml, ``hooks:``): the reference pages are generated when the site is built, never
committed. The configuration reference comes from the typed config schemas, the command-line reference from the
commands' argument parsers, the API reference from the package's docstrings (one ``::: flowllm.<package>`` entry
per package and top-level module, rendered by mkdocstrings).

The checkout being built is documented: its root goes first on ``sys.path``, so an installed flowllm elsewhere
cannot stand in for it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "flowllm"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import cli_reference  # noqa: E402  (beside this file: mkdocs puts the hook's folder on the path while loading it)
import config_reference  # noqa: E402


def api_entries() -> list[str]:
    """``flowllm.<name>`` for every package and top-level module, so a module moved inside a package changes
    nothing here."""
    names = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    names += [p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")]
    return [f"flowllm.{name}" for name in sorted(names)]


def api_page() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings of each package (its `__init__.py`, and the names it exports) and of each "
        "top-level module, with each package's modules and the first paragraph of their docstrings. Where a "
        "package's layer is and what it may import: [Architecture](../concepts/architecture.md).",
        "",
    ]
    for entry in api_entries():
        lines += [f"::: {entry}", "", *module_list(entry), ""]
    return "\n".join(lines)


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring, on one line, read without importing the module."""
    doc = (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").strip()
    return " ".join(doc.split("\n\n", 1)[0].split())


def module_list(entry: str) -> list[str]:
    """A package's modules, each with the first line of its docstring (plain text: nothing to break on a move)."""
    folder = ROOT / Path(*entry.split("."))
    if not folder.is_dir():
        return []
    modules = sorted(p for p in folder.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts)
    lines = [f"Modules of `{entry}`:", ""]
    for path in modules:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        about = summary(path).replace("<", "&lt;").replace("*", r"\*")
        lines.append(f"- `{name}`" + (f": {about}" if about else ""))
    return lines if modules else []


PAGES = {
    "reference/configuration.md": config_reference.reference_page,
    "reference/cli.md": cli_reference.reference_page,
    "reference/api.md": api_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for uri, build in PAGES.items():
        files.append(File.generated(config, uri, content=build()))
    return files
