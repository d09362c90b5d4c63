"""The command line's overrides checked before the Hydra app starts: one line per mistake, with a "did you mean".

Hydra's own messages are several lines of text and tracebacks, suggest ``+key=value`` for a misspelt key (which
then runs and silently ignores the typo), and list the ``base_*`` schemas as if they were choices. Here the same
composition runs first through Hydra's compose API; its errors become one line, and a few mistakes Hydra lets
through are refused: a key added with ``+`` that the structured config does not know, and ``group=base_*``.
Only hydra, omegaconf and the schema are imported, so a bad override is refused in a fraction of a second.

A sweep (``-m a=1,2``) is checked value by value: every value of every swept override once.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from flowllm.config.schema import register_configs
from flowllm.resources import CONFIG_DIR as PACKAGE_CONFIG_DIR

CONFIG_DIR = PACKAGE_CONFIG_DIR
CONFIG_NAME = "config"
SCHEMA_PREFIX = "base_"
# Hydra's launchers come from pip extras: name the one to install when a launcher's config is missing.
LAUNCHER_EXTRAS = {
    "joblib": "launchers",
    "ray": "ray",
    "ray_local": "ray",
    "ray_cluster": "ray",
    "slurm": "slurm",
    "submitit_slurm": "slurm",
    "submitit_local": "slurm",
}
# Hydra's flags that take a value, and those after which no run happens (help, config printing, completion).
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c"}
_FLAGS_WITH_VALUE |= {"--package", "-p", "--experimental-rerun"}
_FLAGS_NO_RUN = {"--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version"}
_FLAGS_OWN_CONFIG = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}


@dataclass(frozen=True)
class CommandLine:
    overrides: list[str]
    multirun: bool
    checkable: bool  # False when Hydra will not run the app (help) or reads another config (-cn, -cp, -cd)


def split_command_line(argv: Sequence[str]) -> CommandLine:
    overrides: list[str] = []
    multirun = False
    checkable = True
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        flag = arg.split("=", 1)[0]
        if arg in ("-m", "--multirun"):
            multirun = True
        elif flag in _FLAGS_NO_RUN or flag in _FLAGS_OWN_CONFIG:
            checkable = False
            i += 1 if (flag in _FLAGS_WITH_VALUE and "=" not in arg) else 0
        elif flag in _FLAGS_WITH_VALUE:
            i += 0 if "=" in arg else 1
        elif arg.startswith("-") and not arg.startswith("--") and "=" not in arg and len(arg) > 1 and arg[1] != "~":
            checkable = False  # a flag we do not know: let Hydra answer it
        else:
            overrides.append(arg)
        i += 1
    return CommandLine(overrides, multirun, checkable)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def visible(options: Sequence[str]) -> list[str]:
    """A group's options without the structured-config schemas (``base_provider``...), which are no choice."""
    return [o for o in options if not o.rsplit("/", 1)[-1].startswith(SCHEMA_PREFIX)]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _launcher_hint(text: str) -> str:
    for name, extra in LAUNCHER_EXTRAS.items():
        if f"hydra/launcher/{name}'" in text or f"hydra/launcher={name}" in text:
            return f" (the launcher comes with an extra: pip install 'flowllm[{extra}]')"
    return ""


class OverrideChecker:
    """Composes the app's config for a list of overrides and explains what is wrong, in one line."""

    def __init__(self, config_dir: Path = CONFIG_DIR, config_name: str = CONFIG_NAME) -> None:
        self.config_dir = config_dir
        self.config_name = config_name
        register_configs()

    def problems(self, command: CommandLine) -> list[str]:
        if not command.checkable:
            return []
        try:
            parsed = OverridesParser.create().parse_overrides(command.overrides)
        except OverrideParseException as exc:
            return [f"cannot read an override: {_first_line(exc)} (see python -m flowllm --hydra-help)"]
        sweeps = [o for o in parsed if o.is_sweep_override()]
        if sweeps and not command.multirun:
            return [f"{sweeps[0].input_line} lists several values: add -m to sweep over them"]
        found: list[str] = []
        for variant in self._variants(parsed):
            problem = self._check(variant)
            if problem and problem not in found:
                found.append(problem)
        return found

    def _variants(self, parsed: list[Override]) -> Iterator[list[str]]:
        """The overrides with every swept value tried once (the others at their first value)."""
        values = {i: list(o.sweep_string_iterator()) for i, o in enumerate(parsed) if o.is_sweep_override()}
        first = [self._with_value(o, values[i][0]) if i in values else str(o.input_line) for i, o in enumerate(parsed)]
        yield first
        for i, options in values.items():
            for value in options[1:]:
                variant = list(first)
                variant[i] = self._with_value(parsed[i], value)
                yield variant

    @staticmethod
    def _with_value(override: Override, value: str) -> str:
        return f"{override.get_key_element()}={value}"  # the key element keeps the override's +, ++ or ~

    def _check(self, overrides: list[str]) -> str | None:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(self.config_dir), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            parsed = OverridesParser.create().parse_overrides(overrides)
            for override in parsed:
                problem = self._schema_choice(override, loader)
                if problem:
                    return problem
            try:
                cfg = compose(self.config_name, overrides=overrides, return_hydra_config=True)
            except MissingConfigException as exc:
                return self._missing_config(exc, loader)
            except (ConfigCompositionException, OmegaConfBaseException) as exc:
                return self._composition(exc, parsed, overrides, loader)
            for override in parsed:
                problem = self._unknown_added_key(override, cfg, loader)
                if problem:
                    return problem
        return None

    @staticmethod
    def _is_group(name: str, loader: Any) -> bool:
        try:
            return bool(loader.repository.group_exists(name))
        except Exception:  # an unusual key Hydra's repository cannot look up: not a group
            return False

    def _schema_choice(self, override: Override, loader: Any) -> str | None:
        if override.is_delete() or override.is_sweep_override() or not self._is_group(override.key_or_group, loader):
            return None
        value = str(override.value())
        if not value.startswith(SCHEMA_PREFIX):
            return None
        group = override.key_or_group
        options = ", ".join(visible(loader.get_group_options(group)))
        return f"{group}={value} is the schema the {group} configs extend, not a choice: pick one of {options}"

    def _missing_config(self, exc: MissingConfigException, loader: Any) -> str:
        text = str(exc)
        missing = exc.missing_cfg_file or ""
        hint = _launcher_hint(text)
        if exc.options is not None and "/" in missing:
            group, _, name = missing.rpartition("/")
            options = visible(exc.options)
            hint = hint or did_you_mean(name, options)
            return f"{group}={name}: no such option{hint} (choose from {', '.join(options)})"
        line = _first_line(exc)
        if hint:
            return f"{line.removesuffix('.')}{hint}"
        return line

    def _composition(self, exc: BaseException, parsed: list[Override], overrides: list[str], loader: Any) -> str:
        text = str(exc)
        cause = exc.__cause__
        culprit = next((o for o in parsed if f"'{o.key_or_group}'" in text or str(o.input_line) in text), None)
        if culprit is not None and "Could not override" in text:
            return self._unknown_key(culprit.key_or_group, overrides, parsed)
        if culprit is not None and "Could not append to config. An item is already at" in text:
            key = culprit.key_or_group
            return f"+{key}: {key} is already set; write {key}={culprit.value()} without the +"
        if culprit is not None and "Could not delete from config" in text:
            key = culprit.key_or_group
            return f"~{key}: there is no {key} to remove{self._near(culprit, overrides, parsed)}"
        if cause is not None:
            full_key: str | None = getattr(cause, "full_key", None) or (culprit.key_or_group if culprit else None)
            where = f"{full_key}: " if full_key else ""
            return f"{where}{_first_line(cause)}"
        return _first_line(exc)

    def _near(self, override: Override, overrides: list[str], parsed: list[Override]) -> str:
        return self._unknown_key(override.key_or_group, overrides, parsed, only_hint=True)

    def _unknown_key(self, key: str, overrides: list[str], parsed: list[Override], *, only_hint: bool = False) -> str:
        """``agent.max_turn``: the first segment that does not exist, and the keys that do exist there."""
        others = [line for line, o in zip(overrides, parsed, strict=True) if o.key_or_group != key]
        try:
            cfg = compose(self.config_name, overrides=others)
        except Exception:
            cfg = None
        parts = key.split(".")
        node: Any = cfg
        for depth, part in enumerate(parts):
            if not isinstance(node, DictConfig) or part not in node:
                parent = ".".join(parts[:depth]) or "the root config"
                keys = [str(k) for k in node] if isinstance(node, DictConfig) else []
                hint = did_you_mean(part, keys)
                if only_hint:
                    return hint
                return f"{key}: {parent} has no setting '{part}'{hint}"
            node = node[part]
        if only_hint:
            return ""
        if isinstance(node, DictConfig):  # Hydra merges into a mapping, whose new keys its struct mode refuses
            return f"{key}: a mapping is set whole with ++{key}={{...}}, or one entry at a time with +{key}.NAME=..."
        return f"{key}: cannot be set"

    def _unknown_added_key(self, override: Override, cfg: DictConfig, loader: Any) -> str | None:
        groups = {override.key_or_group} if self._is_group(override.key_or_group, loader) else set()
        return added_key_problem(override, cfg, groups)


def check_command_line(argv: Sequence[str]) -> list[str]:
    """Every problem with the command line's overrides, one line each; empty when Hydra may start."""
    command = split_command_line(argv)
    try:
        return OverrideChecker().problems(command)
    finally:
        GlobalHydra.instance().clear()


def refuse_ignored_overrides(cfg: DictConfig) -> None:
    """Inside a Hydra job: refuse what composed but would be ignored or cannot run.

    ``+agent.max_turn=3`` composes (Hydra adds the key beside the schema) and nothing reads it; ``provider=
    base_provider`` composes to a config with every required field missing. Raises ConfigError (exit 2).
    """
    from hydra.core.hydra_config import HydraConfig

    from flowllm.errors import ConfigError

    hydra_cfg = HydraConfig.get()
    choices = {str(k): str(v) for k, v in hydra_cfg.runtime.choices.items() if v is not None}
    for group, choice in choices.items():
        if choice.rsplit("/", 1)[-1].startswith(SCHEMA_PREFIX) and not group.startswith("hydra"):
            raise ConfigError(f"{group}={choice} is the schema the {group} configs extend, not a choice")
    # Unresolved: an override may hold ${workspace}, which only a task's folder resolves (tools/client/settings.py).
    task_overrides = [str(o) for o in OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)]  # type: ignore[union-attr]
    for override in OverridesParser.create().parse_overrides(task_overrides):
        problem = added_key_problem(override, cfg, groups=set(choices))
        if problem:
            raise ConfigError(problem)


def added_key_problem(override: Override, cfg: DictConfig, groups: set[str]) -> str | None:
    """``+agent.max_turn=3``: a key added beside a structured config's fields, which nothing would read."""
    if not override.is_add() and not override.is_force_add():
        return None
    key = override.key_or_group
    if key.startswith("hydra.") or key in groups:
        return None
    parent_key, _, name = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig):
        return None
    schema = OmegaConf.get_type(parent)
    if schema is None or not dataclasses.is_dataclass(schema):
        return None  # a free-form mapping (provider.extra_body, tools.servers, pipeline.nodes...): any key goes
    fields = [f.name for f in dataclasses.fields(schema)]
    if name in fields:
        return None
    where = parent_key or "the root config"
    return f"+{key}: {where} has no setting '{name}'{did_you_mean(name, fields)} (a key added with + is never read)"
