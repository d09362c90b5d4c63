"""Rules about flowllm's own source that no linter checks: no program text hidden in string literals.

Code, markup or a page kept in a string is code ruff, mypy and coverage never see. Such text lives in a real
module (``flowllm/tools/child``) or in package data (``flowllm/inspect/templates``); what remains in strings
are messages, prompts and short patterns. Docstrings are documentation, not program text, and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flowllm"
MAX_LINES = 60


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
