"""The ``flowllm`` console command: one entry point for running, inspecting and listing.

    flowllm run [OVERRIDES...]          = python -m flowllm [OVERRIDES...] (also: flowllm OVERRIDES...)
    flowllm inspect RUN [...]           = python -m flowllm.inspect RUN [...]
    flowllm list providers|experiments|tools|pipelines|repair|runners|subagents|launchers
    flowllm sweep-summary SWEEP_DIR     = python -m flowllm.experiment.sweep SWEEP_DIR

``flowllm --help`` lists the config groups and their choices without the ``base_*`` schemas (which are no
choice) and the exit codes; ``flowllm run --hydra-help`` is Hydra's own page.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from flowllm.cli.config_check import CONFIG_DIR, SCHEMA_PREFIX
from flowllm.cli.exit_codes import ExitCode

LISTS = {
    "providers": "provider",
    "experiments": "experiment",
    "tools": "tools",
    "pipelines": "pipeline",
    "repair": "repair",
    "runners": "runner",
    "subagents": "subagents",
    "launchers": "hydra/launcher",
}
_EXIT_CODES = """exit codes: 0 every task completed (right or wrong), 2 a setting, the dataset, a key or a server
  is wrong,
  3 some tasks failed, 4 every task failed, 5 a sweep job errored, 130 interrupted, 1 a bug (traceback)"""


def group_options(group: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    """A config group's choices: its YAML files (and Hydra's launcher plugins), never the base_* schemas."""
    names = {p.stem for p in (config_dir / group).glob("*.yaml")}
    if group == "hydra/launcher":
        names |= {"basic"}
        try:
            from hydra.core.plugins import Plugins
            from hydra.plugins.launcher import Launcher

            for plugin in Plugins.instance().discover(Launcher):
                module = plugin.__module__.split(".")[1] if "." in plugin.__module__ else ""
                names |= {"joblib"} if "joblib" in module else set()
                names |= {"submitit_local", "submitit_slurm"} if "submitit" in module else set()
        except Exception:  # no plugin machinery: the YAML files are the list
            pass
    return sorted(n for n in names if not n.startswith(SCHEMA_PREFIX))


def describe(group: str, name: str, config_dir: Path = CONFIG_DIR) -> str:
    """The first comment line of the option's YAML file: what it is for."""
    path = config_dir / group / f"{name}.yaml"
    if not path.is_file():
        return ""
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if text.startswith("#") and text.strip("# ").strip():
            return text.lstrip("# ").strip()
        if text and not text.startswith("#"):
            break
    return ""


def cmd_list(args: Sequence[str]) -> int:
    if not args or args[0] not in LISTS:
        print(f"flowllm: error: list what? one of {', '.join(LISTS)}", file=sys.stderr)
        return ExitCode.CONFIG
    group = LISTS[args[0]]
    for name in group_options(group):
        about = describe(group, name)
        print(f"{name:<20} {about}" if about else name)
    return ExitCode.OK


def help_text() -> str:
    lines = [
        "usage: flowllm run [-m] [OVERRIDES...]   flowllm inspect RUN [...]   flowllm list WHAT",
        "",
        "Runs the configured experiment (conf/config.yaml). Overrides switch a group or set a key:",
        "  flowllm run provider=claude runner=legacy agent.max_turns=3",
        "  flowllm run -m provider=offline,offline_chat      # a sweep, one job per value",
        "",
        "config groups and their choices:",
    ]
    for what, group in LISTS.items():
        prefix = "+" if group in ("experiment", "subagents") else ""
        lines.append(f"  {prefix}{group}=  {', '.join(group_options(group))}   (flowllm list {what})")
    lines += ["", _EXIT_CODES, "", "Hydra's own options: flowllm run --hydra-help"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        sys.stdout.write(help_text())
        return ExitCode.OK
    if args and args[0] == "list":
        return cmd_list(args[1:])
    if args and args[0] == "inspect":
        from flowllm.inspect.cli import main as inspect_main

        return inspect_main(args[1:])
    if args and args[0] == "sweep-summary":
        from flowllm.experiment.sweep import main as sweep_main

        return sweep_main(args[1:])
    from flowllm.cli.run import run_main

    return run_main(args[1:] if args and args[0] == "run" else args)


def console_main() -> None:
    """The ``flowllm`` console script (pyproject's [project.scripts])."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
