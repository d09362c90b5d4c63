"""A run's result files are read through their records (flowllm/rundir/results.py), never by string keys.

``summary.json``, ``result.json`` and the ledger's lines once were plain dicts read by string in a dozen places,
and a misspelt key ("statistics" for "stats") read None without a word. Now a reader calls ``from_dict`` and
uses attributes, which mypy checks. What mypy cannot see is a file loaded as a plain JSON value; this rule
finds those reads:

* a value is *loaded* when a name is bound, in the same function (or at module level), to a JSON loader's call
  (``read_json``, ``read_artifact``, ``json.loads``, ``orjson.loads``...) whose arguments name a run file
  (``SUMMARY_FILE``, ``RESULT_FILE``, ``LEDGER_FILE``, ``"summary.json"``..., a layout's ``.summary``,
  ``.result(...)``, ``.ledger``), or to such a name's ``.value`` (an artifact); so is ``<x>.summary.value``
  and ``<x>.result.value`` (the artifact of a summary or a result, as inspect's run records hold them);
* a *read by key* is ``v["k"]``, ``v.get("k")`` or ``"k" in v`` of a loaded value ``v`` (or its ``.value``),
  where ``k`` is a top-level key of one of the records.

The record modules themselves are the one place keys are spelled; no other module, flowllm/inspect/ included,
reads a loaded run file by key.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from flowllm.rundir.record_base import KEY, record_fields
from flowllm.rundir.results import LedgerLine, RunSummary, TaskResult

PACKAGE = Path(__file__).resolve().parent.parent / "flowllm"
RECORD_MODULES = {"flowllm/rundir/results.py", "flowllm/rundir/record_base.py", "flowllm/rundir/schema_gen.py"}
KEYS = frozenset(
    f.metadata.get(KEY, f.name) for cls in (RunSummary, TaskResult, LedgerLine) for f in record_fields(cls)
)
LOADERS = frozenset({"read_json", "read_artifact", "_json", "loads", "load", "_result", "read_text", "read_bytes"})
RUN_FILES = (
    "SUMMARY_FILE",
    "RESULT_FILE",
    "LEDGER_FILE",
    "JUDGE_LEDGER_FILE",
    "summary.json",
    "result.json",
    "usage.jsonl",
    ".summary",
    ".result(",
    ".ledger",
    ".judge_ledger",
)
ARTIFACTS = (".summary.value", ".result.value")


def _call_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _loads_a_run_file(node: ast.expr) -> bool:
    """A loader's call whose arguments name a run file (or a method of such a call's result)."""
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        if _call_name(call.func) in LOADERS:
            text = ast.unparse(call)
            if any(marker in text for marker in RUN_FILES):
                return True
    return False


@dataclass
class Scope:
    loaded: set[str] = field(default_factory=set)


class KeyReads(ast.NodeVisitor):
    """The reads by key of loaded run files in one module: (line, key) each."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.scopes = [Scope()]

    def _loaded(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.scopes[-1].loaded or node.id in self.scopes[0].loaded
        if isinstance(node, ast.Attribute) and node.attr == "value":
            if isinstance(node.value, ast.Name) and self._loaded(node.value):
                return True
            return ast.unparse(node).endswith(ARTIFACTS)
        return False

    def _bind(self, targets: list[ast.expr], value: ast.expr | None) -> None:
        if value is None:
            return
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if _loads_a_run_file(value) or self._loaded(value):
            self.scopes[-1].loaded.update(names)
        elif isinstance(value, ast.BoolOp | ast.IfExp) and any(self._loaded(v) for v in ast.walk(value)):
            self.scopes[-1].loaded.update(names)  # ``x = artifact.value if ok else {}``

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes.append(Scope())
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        self._bind(node.targets, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        self._bind([node.target], node.value)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and self._loaded(node.value):
            self._key(node.slice, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("get", "pop") and self._loaded(func.value) and node.args:
            self._key(node.args[0], node.lineno)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if len(node.ops) == 1 and isinstance(node.ops[0], ast.In | ast.NotIn) and self._loaded(node.comparators[0]):
            self._key(node.left, node.lineno)
        self.generic_visit(node)

    def _key(self, node: ast.expr, line: int) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KEYS:
            self.found.append((line, node.value))


def key_reads(path: Path) -> list[tuple[int, str]]:
    visitor = KeyReads()
    visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return visitor.found


def reads_by_file() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        if name not in RECORD_MODULES:
            found = key_reads(path)
            if found:
                out[name] = found
    return out


def test_the_rule_sees_each_kind_of_read(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "import json\n"
        "def f(layout, run):\n"
        "    summary = read_json(layout.summary)\n"
        "    result = read_artifact(folder / RESULT_FILE).value\n"
        "    raw = json.loads(path.read_text())\n"  # not a run file: not counted
        "    a = summary['stats']\n"
        "    b = result.get('answer')\n"
        "    c = 'epochs' in result\n"
        "    d = run.summary.value.get('accuracy')\n"
        "    e = raw['stats'], summary['not_a_record_key']\n"
        "    summary['status'] = 'failed'\n"  # a write, not a read
        "def g(summary):\n"
        "    return summary['stats']\n",  # not loaded here: a typed parameter is mypy's to check
        encoding="utf-8",
    )
    assert key_reads(source) == [(6, "stats"), (7, "answer"), (8, "epochs"), (9, "accuracy")]


def test_no_module_reads_a_loaded_run_file_by_string_key() -> None:
    assert reads_by_file() == {}, "read these through RunSummary / TaskResult / LedgerLine.from_dict and attributes"
