from __future__ import annotations

from pathlib import Path

import pytest

from tests.replay.runs import FixtureRuns, fixture_runs, run_flowllm

KEYED_SERVER = "tool-keyed"  # a server that needs an environment variable nobody sets
UNSET_KEY = "FLOWLLM_INSPECT_TEST_UNSET_KEY"  # unique: never set anywhere


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> FixtureRuns:
    return fixture_runs(tmp_path_factory.getbasetemp() / "flowllm-runs")


@pytest.fixture(scope="session")
def judged_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A judged benchmark's run (the bundled simpleqa sample, offline), with a tool server that is disabled
    because its key is not set: summary.json has a ``breakdown`` and a ``tools.unavailable`` entry."""
    run_dir = tmp_path_factory.getbasetemp() / "flowllm-judged-run"
    run_flowllm(
        run_dir,
        "+experiment=simpleqa_sample",
        f"+tools.servers.{KEYED_SERVER}={{command: python, args: [-c, pass], requires_env: [{UNSET_KEY}]}}",
    ).check()
    return run_dir
