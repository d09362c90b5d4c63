"""The package's import graph has no cycles, and the layers import only downwards.

Every import of a flowllm module counts, at the top of a file or deferred inside a function: a deferred import
that closes a cycle only hides it (import order then matters, and the two modules cannot be understood apart).
Imports under ``if TYPE_CHECKING:`` are left out: they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "flowllm"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    return skipped


def imports_of(path: Path, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name in modules:
                found.add(name)
    return found


def import_graph() -> nx.DiGraph:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        for target in imports_of(path, set(files)):
            if target != name and not name.startswith(target + "."):  # a package's own __init__ is not a cycle
                graph.add_edge(name, target)
    return graph


def test_no_import_cycles() -> None:
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == [], f"import cycles: {cycles[:5]}"


def test_replay_and_the_recorder_do_not_import_inspect() -> None:
    graph = import_graph()
    for module in ("flowllm.providers.replay", "flowllm.engine.recorder", "flowllm.engine.pipeline"):
        reached = nx.descendants(graph, module)
        assert not any(m.startswith("flowllm.inspect") for m in reached), module


def test_no_module_defers_an_import_to_the_bottom_of_the_file() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith(("from flowllm", "import flowllm")) and "noqa: E402" in line:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}: {line}")
    assert offenders == []
