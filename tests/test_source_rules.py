"""Rules about flowllm's own source that no linter checks: no program text hidden in string literals, and sizes.

Code, markup or a page kept in a string is code ruff, mypy and coverage never see. Such text lives in a real
module (``flowllm/tools/child``) or in package data (``flowllm/inspect/templates``); what remains in strings
are messages, prompts and short patterns. Docstrings are documentation, not program text, and are not counted.

Sizes: no package holds more than 15 modules directly (its own ``.py`` files, ``__init__`` included; a
subpackage is one folder, counted on its own), no module is over 600 lines, no function over 80 lines (from its
``def`` line to its last, decorators aside). ``KNOWN_LONG`` lists what still breaks the rule, each with its size
today: it only shrinks (an entry that grew, or no longer breaks the rule, fails the test until it is updated).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flowllm"
MAX_LINES = 60
MAX_MODULES_PER_PACKAGE = 15
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# "module" (lines of the file) or "module:qualified.function" (lines of the function) -> its size today.
KNOWN_LONG: dict[str, int] = {}


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the Constant nodes that are docstrings (of the module, a class or a function)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def long_strings(path: Path) -> list[tuple[int, int]]:
    """(line, line count) of every string constant in ``path`` longer than MAX_LINES lines, docstrings aside;
    a string built with ``+`` from literals counts as one."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    docs = _docstrings(tree)
    out: list[tuple[int, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            text = _literal_sum(node)
            if text is not None and text.count("\n") + 1 > MAX_LINES:
                out.append((node.lineno, text.count("\n") + 1))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            lines = node.value.count("\n") + 1
            if lines > MAX_LINES:
                out.append((node.lineno, lines))
    return out


def _literal_sum(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal_sum(node.left), _literal_sum(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def test_the_rule_sees_a_long_string(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    body = "\n".join(f"x = {i}" for i in range(MAX_LINES + 1))
    source.write_text(f'"""Doc."""\nPROGRAM = r"""\n{body}\n"""\nJOINED = "a\\n" + """{body}"""\n')
    assert sorted({line for line, _ in long_strings(source)}) == [2, MAX_LINES + 5]


def test_no_string_constant_in_flowllm_is_longer_than_60_lines() -> None:
    offenders = {
        f"{path.relative_to(PACKAGE.parent)}:{line} ({count} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, count in long_strings(path)
    }
    assert not offenders, "program text in a string literal: " + ", ".join(sorted(offenders))


def function_sizes(path: Path) -> dict[str, int]:
    """Qualified name (``Class.method``, ``outer.inner``) -> lines, for every function in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    sizes[name] = (child.end_lineno or child.lineno) - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return sizes


def oversized(root: Path) -> dict[str, int]:
    """Every module over MAX_MODULE_LINES and function over MAX_FUNCTION_LINES under ``root`` (named relative to
    its parent, as in KNOWN_LONG), with its size."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root.parent).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            found[name] = lines
        for function, size in function_sizes(path).items():
            if size > MAX_FUNCTION_LINES:
                found[f"{name}:{function}"] = size
    return found


def crowded_packages(root: Path) -> dict[str, int]:
    """Every package under ``root`` that directly holds more than MAX_MODULES_PER_PACKAGE modules."""
    found: dict[str, int] = {}
    for folder in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if (folder / "__init__.py").is_file():
            count = len(list(folder.glob("*.py")))
            if count > MAX_MODULES_PER_PACKAGE:
                found[folder.relative_to(root.parent).as_posix()] = count
    return found


def test_the_size_rules_see_a_long_function_a_long_module_and_a_crowded_package(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"class C:\n    def f(self) -> None:\n{body}")
    (package / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    for i in range(MAX_MODULES_PER_PACKAGE - 2):
        (package / f"m{i}.py").write_text("")
    assert oversized(package) == {"pkg/long.py:C.f": MAX_FUNCTION_LINES + 1, "pkg/big.py": MAX_MODULE_LINES + 1}
    assert crowded_packages(package) == {"pkg": MAX_MODULES_PER_PACKAGE + 1}


def test_no_package_holds_more_than_15_modules() -> None:
    assert crowded_packages(PACKAGE) == {}, "split the package into subpackages by what their modules do"


def test_no_module_over_600_lines_and_no_function_over_80_lines() -> None:
    found = oversized(PACKAGE)
    new = {name: size for name, size in found.items() if name not in KNOWN_LONG}
    assert new == {}, "split these (helpers named for what they do, or a sibling module): " + str(new)
    grown = {name: size for name, size in found.items() if name in KNOWN_LONG and size > KNOWN_LONG[name]}
    assert grown == {}, "known long code grew: split it, do not raise its number in KNOWN_LONG"


def test_the_known_long_code_only_shrinks() -> None:
    fixed = set(KNOWN_LONG) - set(oversized(PACKAGE))
    assert fixed == set(), f"no longer over the limit: remove from KNOWN_LONG: {sorted(fixed)}"
