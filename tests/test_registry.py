"""One registration style: every named choice is a ``Registry``, found through ``require`` with one message, and
extended by plug-ins through the entry-point group of its registry."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flowllm.config.provider_schema import ProviderConfig
from flowllm.core import registry as registry_module
from flowllm.core.registry import Registry, unknown_choice
from flowllm.datasets.adapters import ADAPTERS, DatasetSpec, load_dataset
from flowllm.datasets.gaia import find_dataset_file
from flowllm.datasets.task import DatasetError
from flowllm.engine.recorder import Recorder
from flowllm.engine.runners import RUNNERS, make_runner
from flowllm.errors import ConfigError, PluginError
from flowllm.parsing import FORMATS, STAGES, repair_json, validate_formats, validate_stages
from flowllm.providers.errors import ProviderConfigError
from flowllm.providers.factory import PROTOCOLS, check_provider_config
from flowllm.scoring import SCORERS, check_scorer
from flowllm.scoring.judge import judge_template
from flowllm.scoring.templates import TEMPLATES


def test_every_choice_kind_is_a_registry_with_its_config_key_and_plugin_group() -> None:
    kinds = {r.key: (r.group, r.names()) for r in (RUNNERS, PROTOCOLS, ADAPTERS, SCORERS, TEMPLATES)}
    assert kinds == {
        "runner": ("flowllm.runners", ["graph", "graph_parallel", "legacy"]),
        "provider.protocol": ("flowllm.protocols", ["anthropic", "openai_chat", "openai_responses", "replay"]),
        "dataset.adapter": ("flowllm.dataset_adapters", ["gaia", "table"]),
        "dataset.scorer": ("flowllm.scorers", ["exact", "gaia", "judge"]),
        "judge.template": ("flowllm.judge_templates", ["browsecomp", "hle", "simpleqa"]),
    }
    assert (STAGES.key, STAGES.group) == ("repair.stages", "flowllm.repair_stages")
    assert {"strict", "fences", "escapes", "python", "json5", "lenient"} <= set(STAGES)
    assert (FORMATS.key, FORMATS.group) == ("parse_tool_calls.formats", "flowllm.toolcall_formats")
    assert {"mcp_xml", "hermes", "json", "anthropic"} <= set(FORMATS)


def test_a_name_is_registered_once_and_a_wrong_one_lists_the_choices() -> None:
    registry: Registry[int] = Registry("thing", {"one": 1})
    registry.register("two", 2)
    registry.register("two", 2)  # the same item again: harmless (a module imported twice)
    with pytest.raises(ValueError, match="thing: 'two' is registered already"):
        registry.register("two", 3)
    with pytest.raises(ConfigError, match=r"^thing must be one of one, two, not 'three'$"):
        registry.require("three")
    assert registry.require("one") == 1


def test_a_misspelt_name_gets_the_closest_choice() -> None:
    message = unknown_choice("provider.protocol", "anthropc", ["anthropic", "openai_chat", "openai_responses"])
    assert message == (
        "provider.protocol must be one of anthropic, openai_chat, openai_responses, not 'anthropc' "
        "(did you mean 'anthropic'?)"
    )


@pytest.mark.parametrize(
    ("lookup", "error", "message"),
    [
        (
            lambda: make_runner("grph"),
            ConfigError,
            r"^runner must be one of .*, not 'grph' \(did you mean 'graph'\?\)",
        ),
        (
            lambda: check_scorer("exakt"),
            ConfigError,
            r"^dataset\.scorer must be one of gaia, exact, judge, not 'exakt",
        ),
        (
            lambda: judge_template("simpleq"),
            ConfigError,
            r"^judge\.template .*\(did you mean 'simpleqa'",
        ),
        (lambda: validate_stages(["strict", "lenint"]), ConfigError, r"^repair\.stages .*did you mean 'lenient'"),
        (lambda: validate_formats(["hermez"]), ConfigError, r"^parse_tool_calls\.formats .*did you mean 'hermes'"),
        (lambda: Recorder(Path("unused"), snapshot="al"), ConfigError, r"^recorder\.snapshot must be one of all, "),
        (
            lambda: check_provider_config(ProviderConfig(name="x", protocol="anthropc", model="m")),
            ProviderConfigError,
            r"^provider\.protocol must be one of anthropic, .*, not 'anthropc' \(did you mean 'anthropic'\?\)$",
        ),
        (lambda: find_dataset_file(Path("."), "gaai"), DatasetError, r"^dataset\.format .*did you mean 'gaia'"),
        (lambda: load_dataset(DatasetSpec(Path("."), adapter="tabel")), DatasetError, r"did you mean 'table'"),
        (
            lambda: DatasetSpec.from_config({"decrypt": "sha265_xor"}, Path(".")),
            DatasetError,
            r"^dataset\.decrypt must be one of none, .*did you mean 'sha256_xor'",
        ),
    ],
)
def test_each_registry_refuses_a_wrong_name_in_one_line(lookup: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message) as refused:
        lookup()  # type: ignore[operator]
    assert "\n" not in str(refused.value)


def test_each_registry_finds_its_builtins() -> None:
    assert make_runner("legacy").name == "legacy"
    assert judge_template("hle").name == "hle"
    assert repair_json("{'a': 1}", stages=["strict", "python"]).stage == "python"
    assert SCORERS.require("exact") is SCORERS.get("exact")
    assert PROTOCOLS.require("openai_chat").build is not None


# -- plug-ins through entry points, without installing anything: a distribution's metadata on sys.path --------


def _distribution(root: Path, name: str, entry_points: str, module: str, source: str) -> None:
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")
    (root / f"{module}.py").write_text(source, encoding="utf-8")


@pytest.fixture
def plugin_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_plugins_are_read_once_on_the_first_lookup(plugin_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _distribution(
        plugin_root, "thing_plugin", "[flowllm.test_things]\nthree = thing_plugin_module:THREE\n",
        "thing_plugin_module", "THREE = 3\n",
    )  # fmt: skip
    reads: list[str] = []
    real = registry_module.entry_points

    def counted(*, group: str) -> object:
        reads.append(group)
        return real(group=group)

    monkeypatch.setattr(registry_module, "entry_points", counted)
    registry: Registry[int] = Registry("thing", {"one": 1}, group="flowllm.test_things")
    assert reads == [] and "thing_plugin_module" not in sys.modules  # nothing is read before a lookup
    assert registry.require("three") == 3
    assert registry.choices() == "one, three"  # built-ins first
    assert registry.get("one") == 1 and "three" in registry
    assert reads == ["flowllm.test_things"]


def test_a_plugin_that_fails_to_import_is_one_line_naming_it_and_its_distribution(plugin_root: Path) -> None:
    _distribution(
        plugin_root, "broken_plugin", "[flowllm.test_broken]\nbad = broken_plugin_module:ITEM\n",
        "broken_plugin_module", "import no_such_module_anywhere\nITEM = 1\n",
    )  # fmt: skip
    registry: Registry[int] = Registry("thing", {"one": 1}, group="flowllm.test_broken")
    expected = (
        r"^plug-in 'bad' \(flowllm\.test_broken = broken_plugin_module:ITEM, from broken_plugin\) failed to load: "
        r"ModuleNotFoundError: No module named 'no_such_module_anywhere' \(fix or uninstall broken_plugin\)$"
    )
    for _ in range(2):  # said at every lookup, not only the first
        with pytest.raises(PluginError, match=expected):
            registry.get("one")


def test_a_plugin_of_the_wrong_kind_or_name_is_refused(plugin_root: Path) -> None:
    _distribution(
        plugin_root, "odd_plugin",
        "[flowllm.test_odd_format]\nodd = odd_plugin_module:NOT_A_FORMAT\n"
        "[flowllm.test_clash]\none = odd_plugin_module:NOT_A_FORMAT\n",
        "odd_plugin_module", "NOT_A_FORMAT = 'text'\n",
    )  # fmt: skip

    def number(name: str, loaded: object) -> int:
        if not isinstance(loaded, int):
            raise TypeError(f"expected a number, got {loaded!r}")
        return loaded

    numbers = Registry("thing", {}, group="flowllm.test_odd_format", adapt=number)
    with pytest.raises(PluginError, match=r"^plug-in 'odd' .* is no thing entry: expected a number, got 'text'$"):
        numbers.get("odd")
    clash: Registry[object] = Registry("thing", {"one": 1}, group="flowllm.test_clash")
    with pytest.raises(PluginError, match=r"thing 'one' exists already; give the entry point another name$"):
        clash.get("one")
