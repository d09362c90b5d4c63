"""The package's import graph has no cycles, and the layers import only downwards.

Every import of a flowllm module counts, at the top of a file or deferred inside a function: a deferred import
that closes a cycle only hides it (import order then matters, and the two modules cannot be understood apart).
Imports under ``if TYPE_CHECKING:`` count for the layers too (a type named from a higher layer is a dependency
on it all the same); only the module-level cycle check leaves them out, since they never run.

The layers (docs/concepts/architecture.md, "Layers": tests/test_manual_pages.py checks the page), lowest first; a
package imports its own layer and those below, never above, and no two packages import each other (directly or
round a longer loop):
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "flowllm"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "exit_codes", "resources", "core", "rundir", "config"),  # base: contracts, the run folder, schemas
    ("engine", "parsing"),  # the turn graph and its runners; reading model output
    ("providers", "tools", "emulator"),  # services: model endpoints, tool servers, the loopback emulator
    ("nodes", "agent", "memory"),  # what runs in a turn, and the loop around turns
    ("datasets", "scoring", "export", "telemetry"),  # tasks in, scores out; a saved run read as other tools' formats
    ("spend",),  # prices, the run's bill and budget, per-task limits, projections
    ("run",),  # one process's run of tasks: runner, epochs, outcomes, progress, the summary
    ("setup", "sweep"),  # a run built from its config, preflight, fingerprint; a sweep's summary
    ("experiment",),  # an experiment across processes: workers, Ray
    ("app", "cli", "inspect", "verify", "analysis", "__main__", "data", "bundle"),  # entry points, the auditor,
    # notebooks, reproduction bundles
)
# Imports that break the order, each with where it should go; the test fails when one is gone, so the lists only
# shrink.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
KNOWN_LOOPS: dict[tuple[str, str], str] = {}
# The composed Hydra config is read by the loader (config) and the layers that build a run from it; the packages
# below them take plain mappings and typed settings. Only the node builder hands plain mappings to Hydra's
# ``instantiate`` (a node's ``_target_`` and arguments).
CONFIG_FREE = (
    "core",
    "rundir",
    "engine",
    "parsing",
    "providers",
    "tools",
    "emulator",
    "nodes",
    "agent",
    "memory",
    "datasets",
    "scoring",
)
CONFIG_LIBRARIES = ("omegaconf", "hydra")
ALLOWED_CONFIG_IMPORTS = {("flowllm.engine.instantiate", "hydra.utils.instantiate")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    return skipped


def imports_of(path: Path, modules: set[str], *, type_checking: bool = True) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set() if type_checking else _type_checking_only(tree)
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


def import_graph(*, type_checking: bool = True) -> nx.DiGraph:
    """Module -> the flowllm modules it imports; ``type_checking=False``: only the imports that run."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        for target in imports_of(path, set(files), type_checking=type_checking):
            if target != name and not name.startswith(target + "."):  # a package's own __init__ is not a cycle
                graph.add_edge(name, target)
    return graph


def test_no_import_cycles() -> None:
    cycles = list(nx.simple_cycles(import_graph(type_checking=False)))
    assert cycles == [], f"import cycles: {cycles[:5]}"


def test_replay_and_the_recorder_do_not_import_inspect() -> None:
    graph = import_graph(type_checking=False)
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


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(package: str) -> int:
    for number, layer in enumerate(LAYERS):
        if package in layer:
            return number
    raise AssertionError(f"package flowllm.{package} is in no layer: add it to LAYERS, docs/concepts/architecture.md")


def test_every_package_has_a_layer() -> None:
    packages = {package_of(m) for m in import_graph().nodes} - {""}
    listed = [p for layer in LAYERS for p in layer]
    assert len(listed) == len(set(listed)), "a package is in two layers"
    for package in packages:
        _layer(package)


def test_layers_import_only_downwards() -> None:
    graph = import_graph()
    upward = {
        (a, b)
        for a, b in graph.edges
        if package_of(a) and package_of(b) and _layer(package_of(a)) < _layer(package_of(b))
    }
    assert upward - set(KNOWN_UPWARD) == set(), "imports against the layer order"


def test_no_two_packages_import_each_other() -> None:
    packages = nx.DiGraph()
    for a, b in import_graph().edges:
        pa, pb = package_of(a), package_of(b)
        if pa and pb and pa != pb and (a, b) not in KNOWN_UPWARD and (a, b) not in KNOWN_LOOPS:
            packages.add_edge(pa, pb)
    cycles = list(nx.simple_cycles(packages))
    assert cycles == [], f"package-level import cycles: {cycles[:5]}"


def config_imports(path: Path) -> set[str]:
    """The names a file imports from omegaconf or hydra (``hydra.utils.instantiate``, ``omegaconf``...)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in CONFIG_LIBRARIES)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in CONFIG_LIBRARIES:
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_layers_below_the_run_builders_do_not_read_hydra_config() -> None:
    offenders = sorted(
        (module_name(path), name)
        for path in PACKAGE.rglob("*.py")
        if package_of(module_name(path)) in CONFIG_FREE
        for name in config_imports(path)
        if (module_name(path), name) not in ALLOWED_CONFIG_IMPORTS
    )
    assert offenders == [], f"imports of omegaconf/hydra below the setup layer: {offenders}"


def test_config_imports_are_found(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "import omegaconf\nfrom hydra.utils import instantiate\ndef f():\n    from omegaconf import OmegaConf\n",
        encoding="utf-8",
    )
    assert config_imports(source) == {"omegaconf", "hydra.utils.instantiate", "omegaconf.OmegaConf"}


def test_the_known_exceptions_still_exist() -> None:
    edges = set(import_graph().edges)
    assert {*KNOWN_UPWARD, *KNOWN_LOOPS} - edges == set(), "fixed: remove these from KNOWN_UPWARD / KNOWN_LOOPS"


def test_deferred_and_type_checking_imports_are_counted(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import flowllm.errors\n"
        "if TYPE_CHECKING:\n"
        "    from flowllm.app import run\n"
        "def later() -> None:\n"
        "    from flowllm.setup import build\n",
        encoding="utf-8",
    )
    modules = {"flowllm.errors", "flowllm.app", "flowllm.app.run", "flowllm.setup", "flowllm.setup.build"}
    assert imports_of(source, modules) == modules
    assert imports_of(source, modules, type_checking=False) == {
        "flowllm.errors",
        "flowllm.setup",
        "flowllm.setup.build",
    }
