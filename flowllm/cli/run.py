"""``python -m flowllm`` / ``flowllm run``: the Hydra app, with its configuration mistakes said in one line.

The Hydra entry point lives here, apart from ``flowllm.app``: the app's module (the SDKs, the MCP client, the
engine) is imported only once Hydra has composed the config, so a bad override is refused quickly. Hydra's own
error printing is bypassed (``HYDRA_FULL_ERROR``) and its exceptions are explained by ``flowllm.config.check``: one
line on stderr, exit 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from flowllm.config.check import (
    CONFIG_DIR,
    CONFIG_NAME,
    _first_line,
    check_command_line,
    refuse_ignored_overrides,
    split_command_line,
)
from flowllm.config.schema import register_configs
from flowllm.errors import CarriedError, ConfigError
from flowllm.exit_codes import ExitCode, error_exit_code

PROG = "flowllm"


def _register() -> None:
    register_configs()
    # ${flowllm_abspath:...}: launchers that run elsewhere (Ray) need absolute folders; hydra.sweep.dir is relative.
    OmegaConf.register_new_resolver("flowllm_abspath", lambda p: str(Path(str(p)).resolve()), replace=True)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=CONFIG_NAME)
def hydra_app(cfg: DictConfig) -> Any:
    if HydraConfig.get().mode != RunMode.MULTIRUN:  # a multirun job records its own error (flowllm.app)
        try:
            refuse_ignored_overrides(cfg)
        except ConfigError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            sys.exit(ExitCode.CONFIG)
    from flowllm.app import hydra_job  # the heavy imports, once the config is known to be sound

    return hydra_job(cfg)


def explain(exc: BaseException, argv: Sequence[str]) -> str:
    """One line for a Hydra or OmegaConf error met while composing the config of ``argv``."""
    try:
        problems = check_command_line(argv)
    except Exception:  # the explanation must never hide the error it explains
        problems = []
    return "; ".join(problems) if problems else _first_line(exc)


def run_main(argv: Sequence[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line); returns the exit code (see flowllm.exit_codes)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):  # Hydra's page lists the base_* schemas as choices: ours does not
        from flowllm.cli.listing import help_text

        sys.stdout.write(help_text())
        return ExitCode.OK
    # Ray (hydra/launcher=ray) reads these when it starts a local instance: no usage reporting, no token
    # authentication between the processes of one machine. A user who needs either sets the variable.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"  # the user asked for Hydra's full tracebacks
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing: explained below
    _register()
    command = split_command_line(args)
    if command.multirun and command.checkable and not full_error:
        # A sweep is checked as a whole before its first job: every problem of every job once, no job started.
        problems = check_command_line(args)
        if not problems:
            from flowllm.cli.sweep_check import sweep_problems  # composes every job with the app's checks

            problems = sweep_problems(args)
        if problems:
            for problem in problems:
                print(f"{PROG}: error: {problem}", file=sys.stderr)
            return ExitCode.CONFIG
    saved_argv = sys.argv
    sys.argv = [saved_argv[0] if saved_argv else PROG, *args]
    try:
        hydra_app()
    except (HydraException, OmegaConfBaseException) as exc:
        if full_error:
            raise
        print(f"{PROG}: error: {explain(exc, args)}", file=sys.stderr)
        return ExitCode.CONFIG
    except CarriedError as carried:  # raised before the job ran (a Hydra callback: the run folder cannot be written)
        error = carried.error
        for line in str(error).splitlines() or [type(error).__name__]:
            print(f"{PROG}: error: {line}", file=sys.stderr)
        return error_exit_code(error)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (ExitCode.OK if exc.code is None else ExitCode.BUG)
    finally:
        sys.argv = saved_argv
    return ExitCode.OK
