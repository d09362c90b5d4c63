"""The manual is executed: every ``python -m flowllm ...`` line the README and the documentation pages (docs/)
show is composed by Hydra as written (the choices and keys exist, enum values are accepted as the manual spells
them), and the ones that need no key or network are run on the offline sample, each ending as a run ends (exit 0,
or 3 when a budget stops it) with a folder that passes ``flowllm verify``. A command shown on several pages runs
once, named by its first place. The other commands (inspect, verify, sweep-summary): tests/test_manual_tools.py.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from flowllm.config.schema import register_configs
from flowllm.resources import CONFIG_DIR
from flowllm.verify import audit_run
from tests.experiment.helpers import run_flowllm
from tests.manual import manual_lines

pytestmark = pytest.mark.long

COMMAND = re.compile(r"(?:^|`)\s*(?:[A-Z_]+=\S+\s+)*python -m flowllm(?= |$|`)([^`\n]*)")
# Words the manual uses for a folder the reader has: the test gives it a run it made.
RUN_WORDS = {"RUN", "RUN_A", "RUN_B", "runs/2026-12-02/10-00-00", "runs/2026-12-04/10-00-00", "runs/first-sweep"}
# Overrides that reach outside this machine (a key, a gateway, a launcher's cluster): composed, never run.
ONLINE = re.compile(
    r"^(provider=(?!offline|replay)|provider\.live=(?!offline)|provider\.base_url=|judge\.provider=|"
    r"tools\.(search|vision)\.|hydra/launcher=|telemetry\.otlp_endpoint=|\+experiment=(?!\w+_sample))"
)
# Composed, not run: a field the 10-task sample does not have; a price table the reader writes.
COMPOSED_ONLY = {"stats.cluster_by=category", "experiment.pricing=my_prices.yaml"}


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    args: tuple[str, ...]

    @property
    def sweep(self) -> bool:
        return "-m" in self.args

    def overrides(self, run: Path | None = None) -> list[str]:
        """The overrides as one job of it composes them: a sweep's first value of each swept key, a run folder for
        the manual's placeholder."""
        found = []
        for arg in self.args:
            if arg in ("-m", "...") or arg.startswith(("hydra/launcher=", "hydra.launcher.", "hydra.run.dir=")):
                continue  # the test gives each run its own folder; launchers are composed by Hydra's plugins
            key, _, value = arg.partition("=")
            if value in RUN_WORDS and run is not None:
                value = str(run)
            elif self.sweep and "," in value and not value.startswith(("[", "{", "'")):
                value = value.split(",")[0]
            found.append(f"{key}={value}" if _ else key)
        return found

    @property
    def offline(self) -> bool:
        return not any(ONLINE.match(a) for a in self.args) and not any(a in COMPOSED_ONLY for a in self.args)


def manual_commands() -> list[Command]:
    found: dict[tuple[str, ...], Command] = {}
    for page, number, line in manual_lines():
        for match in COMMAND.finditer(line):
            rest = match.group(1)
            if rest.startswith("."):  # python -m flowllm.inspect ...: another command
                continue
            args = tuple(a for a in shlex.split(rest, comments=True) if a not in ("&&", "|"))
            if not args or set(args) == {"..."} or args[0].startswith(("-h", "--")) or args[0] == "verify":
                continue  # python -m flowllm verify: the auditor, tested with the other commands
            found.setdefault(args, Command(page, number, match.group(0).strip(" `"), args))
    return list(found.values())


COMMANDS = manual_commands()
IDS = [f"{c.page}:{c.line}" for c in COMMANDS]


def test_the_manual_shows_commands() -> None:
    assert len(COMMANDS) > 30
    assert any(c.args == ("+experiment=gaia", "provider=claude") for c in COMMANDS)
    assert {c.page for c in COMMANDS} >= {"README.md", "docs/getting-started.md", "docs/guides/budgets.md"}


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_every_manual_command_composes(command: Command, tmp_path: Path) -> None:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=command.overrides(tmp_path))
    assert cfg.dataset.path


RUNNABLE = [c for c in COMMANDS if c.offline]


@pytest.mark.parametrize("command", RUNNABLE, ids=[f"{c.page}:{c.line}" for c in RUNNABLE])
def test_every_offline_manual_command_runs_and_verifies(command: Command, tmp_path: Path, sample_run: Path) -> None:
    run = tmp_path / "run"
    # memory.path's default is relative to the working directory, the checkout: each run keeps its own store.
    args = [
        *command.overrides(sample_run),
        "progress=false",
        f"hydra.run.dir={run}",
        f"memory.path={tmp_path / 'm.db'}",
    ]
    done = run_flowllm(*args)
    assert done.returncode in (0, 3), f"{command.page} line {command.line}: {command.text}\n{done.stderr[-3000:]}"
    audit = audit_run(run)
    assert audit.verified, "\n".join(f.line() for f in audit.findings)
