"""summary.json → provenance: versions, the commit of a checkout, hashes, the fingerprint; inspect shows it and
``diff`` lists its differences (and the result-changing settings') first."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

import pytest
from omegaconf import DictConfig

from flowllm.inspect.cli import main
from flowllm.setup.fingerprint import guard
from flowllm.setup.provenance import NOT_INSTALLED, collect, package_versions
from tests.experiment.helpers import GAIA, ROOT, gaia_overrides
from tests.inspect.minirun import write_run, write_task

PRICES = ROOT / "flowllm" / "conf" / "pricing.yaml"


Compose = Callable[[Sequence[str]], DictConfig]


def test_provenance_of_a_run_from_this_checkout(composed: Compose, tmp_path: Path) -> None:
    recorded = guard(composed(gaia_overrides()), tmp_path, GAIA)
    data = collect(tmp_path, PRICES)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert data["flowllm"]["commit"] == head.stdout.strip()
    assert isinstance(data["flowllm"]["dirty"], bool)
    assert data["python"]["version"] == platform.python_version()
    assert data["packages"]["anthropic"] == metadata.version("anthropic")
    assert data["packages"]["mcp"] == metadata.version("mcp")
    assert data["config_fingerprint"] == recorded.digest and data["earlier_fingerprints"] == []
    metadata_hash = hashlib.sha256((GAIA / "metadata.jsonl").read_bytes()).hexdigest()
    assert data["dataset_files"]["metadata.jsonl"] == metadata_hash
    assert data["price_table"]["sha256"] == hashlib.sha256(PRICES.read_bytes()).hexdigest()
    assert data["os"]["system"] == platform.system()
    json.dumps(data)  # all of it goes into summary.json


def test_a_package_that_is_absent_is_said_so() -> None:
    assert package_versions(("flowllm-no-such-package",)) == {"flowllm-no-such-package": NOT_INSTALLED}


def test_without_a_fingerprint_the_hashes_are_not_known(tmp_path: Path) -> None:
    data = collect(tmp_path, tmp_path / "missing.yaml")
    assert data["config_fingerprint"] == "not known" and data["dataset_files"] == "not known"
    assert data["price_table"]["sha256"] == "not known"


def _run(tmp_path: Path, name: str, repair: str, anthropic: str, cfg: DictConfig) -> Path:
    run = tmp_path / name
    guard(cfg, run, GAIA)
    prov = collect(run, PRICES)
    prov["packages"]["anthropic"] = anthropic
    write_run(run, {"provenance": prov, "repair": repair})
    write_task(run, "t1", [[("call_model", {"messages": []}, {"response": {"text": "42"}})]])
    return run


def test_inspect_shows_it_and_diff_lists_its_differences_first(
    composed: Callable[[Sequence[str]], DictConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run(tmp_path, "a", "full", "1.0.0", composed(gaia_overrides("repair=full")))
    b = _run(tmp_path, "b", "strict", "2.0.0", composed(gaia_overrides("repair=strict")))
    assert main([str(a)]) == 0
    out = capsys.readouterr().out
    assert "provenance" in out and "anthropic 1.0.0" in out and "config fingerprint" in out
    assert main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    first = out.index("provenance and settings that differ")
    assert first < out.index("spend")
    assert "provenance.packages.anthropic" in out and "1.0.0 -> 2.0.0" in out
    assert "repair.name" in out and "full -> strict" in out
    assert main(["diff", str(a), str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["provenance"]["provenance.packages.anthropic"] == {"a": "1.0.0", "b": "2.0.0"}
    assert data["provenance"]["repair.name"] == {"a": "full", "b": "strict"}
    assert "provenance.os.platform" not in data["provenance"]  # the same machine
