from __future__ import annotations

import pytest

from tests.replay.runs import FixtureRuns, fixture_runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> FixtureRuns:
    return fixture_runs(tmp_path_factory.getbasetemp() / "flowllm-runs")
