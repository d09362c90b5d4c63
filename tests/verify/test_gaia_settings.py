"""``+experiment=gaia`` with some of its tool servers removed verifies: ``flowllm verify`` recomputes the run's
settings with flowllm's own resolvers (``${flowllm_search_env:...}``), as the run did, not a half-resolved config
(which differed from the fingerprint in every interpolated setting, ``pipeline.hook_nodes.*`` first)."""

from __future__ import annotations

from pathlib import Path

from tests.experiment.helpers import run_flowllm

DATA = Path(__file__).resolve().parents[1] / "bundle" / "data" / "gaialike"


def test_a_gaia_run_without_browse_and_audio_verifies(tmp_path: Path) -> None:
    run = tmp_path / "gaia"
    done = run_flowllm(
        "+experiment=gaia",
        "provider=offline",
        f"provider.emulator_script={DATA / 'script.yaml'}",
        f"dataset.path={DATA}",
        "dataset.limit=1",
        "progress=false",
        "~tools.servers.tool-browse",
        "~tools.servers.tool-audio",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    verified = run_flowllm("verify", str(run))
    assert verified.returncode == 0, verified.stdout[-3000:]
    assert f"flowllm verify: {run}: verified" in verified.stdout
