"""What the configs offer: each group's choices (never the ``base_*`` schemas) and the help page built from them.

Shared by ``flowllm list``/``--help`` (command.py) and ``python -m flowllm --help`` (run.py).
"""

from __future__ import annotations

from pathlib import Path

from flowllm.config.check import CONFIG_DIR, SCHEMA_PREFIX

__all__ = ["LISTS", "describe", "group_options", "help_text"]

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
_EXIT_CODES = """exit codes: 0 every task completed (right, wrong or unscored), 2 nothing ran: a setting, the dataset,
  a key or a server is wrong (a build error),
  3 some tasks failed (or a run error stopped the run after some completed), 3 the run's budget
  (experiment.budget) ended it with tasks left (a rerun with a higher budget resumes), 4 every task failed (or
  none completed before a run error), 5 a sweep job errored, 6 flowllm verify found a number the evidence does
  not give, 130 interrupted, 1 a bug (traceback)"""


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
    """The first comment line of the option's YAML file: what it is for (never a Hydra directive such as
    ``# @package _global_``, which is not a description)."""
    path = config_dir / group / f"{name}.yaml"
    if not path.is_file():
        return ""
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if text.startswith("#") and text.lstrip("# ").startswith("@"):
            continue
        if text.startswith("#") and text.strip("# ").strip():
            return text.lstrip("# ").strip()
        if text and not text.startswith("#"):
            break
    return ""


def help_text() -> str:
    lines = [
        "usage: flowllm run [-m] [OVERRIDES...]   flowllm inspect RUN [...]   flowllm list WHAT",
        "       flowllm verify RUN [--json]   (every number of a run recomputed from its evidence: exit 0 agrees,",
        "       6 a disagreement, 2 not a run)",
        "       flowllm bundle RUN -o FILE   flowllm verify FILE [--dataset PATH]   (a run anyone can check offline)",
        "       flowllm merge SHARD... -o RUN   (the folders of experiment.shard=I/N runs merged into one run)",
        "       flowllm ctl RUN status|pause|resume|drain|stop|set KEY=VALUE|requeue TASK   (steer a running run)",
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
