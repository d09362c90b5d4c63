"""Re-judging a saved run: ``python -m flowllm provider=replay provider.run_dir=RUN judge.provider=gpt5``.

The replay provider serves the saved run's model replies, so the agent's model is never called; the judge is
called for real (or replayed too, with ``judge.provider=replay judge.run_dir=...``). For the answers to be
those of the saved run, the run must be the same experiment: when the command line picks no experiment,
the saved run's composed config (``RUN/.hydra/config.yaml``: dataset, scorer, judge, agent, tools, ...) is the
base, and only what the command line names is taken from the new composition: the provider (always), each
``group=option`` or top-level key as a whole, each dotted key (``judge.provider=...``) by itself, and each
``~key`` deletion. With ``+experiment=...`` on the command line the new composition is used as it is.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from flowllm.config.schema import FlowConfig
from flowllm.providers.errors import ProviderConfigError
from flowllm.providers.replay import REPLAY_PROTOCOL, resolve_run_dir
from flowllm.rundir.layout import RunLayout

log = logging.getLogger(__name__)

KEPT = ("provider",)  # always the new run's
# Settings that belong to the judge provider they were written for: naming another judge on the command line
# drops the saved run's (a sample's scripted judge must not stand in for a real one).
COUPLED = {"judge.provider": ("judge.emulator_script", "judge.run_dir")}


def _command_line() -> list[str] | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return [str(o) for o in HydraConfig.get().overrides.task]
    except ValueError:  # not under Hydra (run() called directly): nothing to inherit from
        return None


def inherit_replayed_run(cfg: DictConfig, overrides: list[str] | None = None) -> DictConfig:
    """``cfg`` itself, or for a replay run without an experiment, the saved run's config with the command
    line's choices applied (see the module docstring)."""
    if OmegaConf.select(cfg, "provider.protocol") != REPLAY_PROTOCOL or not OmegaConf.select(cfg, "provider.run_dir"):
        return cfg
    overrides = _command_line() if overrides is None else overrides
    if overrides is None:
        return cfg
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    # An experiment named on the command line (+experiment=...) is replayed as named; a setting of the
    # experiment section (experiment.resume=force) is not a choice of experiment.
    if any(o.key_or_group.lstrip("+~").split("/")[-1] == "experiment" for o in parsed):
        return cfg
    saved_path = RunLayout(resolve_run_dir(str(cfg.provider.run_dir))).config
    if not saved_path.is_file():
        return cfg  # the replay provider says what is wrong with the run folder
    try:
        saved = OmegaConf.load(saved_path)
    except Exception as exc:
        raise ProviderConfigError(f"provider.run_dir: cannot read {saved_path}: {str(exc).splitlines()[0]}") from exc
    assert isinstance(saved, DictConfig)
    # The saved run on the structured schema (so every value is typed and checked as at composition), each
    # section replaced as a whole, not merged key by key into the new one (its tool servers are not ours).
    try:
        merged = OmegaConf.merge(OmegaConf.structured(FlowConfig), {k: v for k, v in saved.items() if k not in KEPT})
    except Exception as exc:  # a run made by another flowllm version: a key or type this one does not know
        raise ProviderConfigError(
            f"provider.run_dir: {saved_path} does not fit this version's settings ({str(exc).splitlines()[0]}); "
            "name the experiment on the command line (+experiment=...) to replay it with the current ones"
        ) from None
    assert isinstance(merged, DictConfig)
    named = {o.key_or_group.lstrip("+~") for o in parsed}
    _newer_node_settings(merged, cfg)
    with open_dict(merged):
        for key in KEPT:
            merged[key] = cfg[key]
        # Where this run is kept is this session's choice: the saved run's store holds the saved run. So is where it
        # keeps its spend: under the saved run's experiment.coordination key, its budget would be the saved run's,
        # already spent (a fork of a run its budget stopped started no task).
        for own in ("experiment.store", "experiment.coordination"):
            OmegaConf.update(merged, own, OmegaConf.select(cfg, own), force_add=True)
        for override in parsed:
            key = override.key_or_group.lstrip("+~")
            if key.startswith("hydra") or key.split(".")[0] in KEPT:
                continue
            if override.is_delete():
                _delete(merged, key)
            elif "." not in key:  # a group choice or a top-level value: the whole section, as composed now
                merged[key] = cfg.get(key, None)
            else:
                OmegaConf.update(merged, key, OmegaConf.select(cfg, key), force_add=True)
                for coupled in COUPLED.get(key, ()):
                    if coupled not in named:
                        OmegaConf.update(merged, coupled, OmegaConf.select(cfg, coupled), force_add=True)
    log.info("replay: the run repeats %s (its dataset, scoring, agent and tools settings)", Path(saved_path).parents[1])
    return merged


def _newer_node_settings(merged: DictConfig, cfg: DictConfig) -> None:
    """A node setting the saved run's version did not have yet (``mark_cache.breakpoints``) takes this version's
    value, as written in the composed pipeline, when the node is the same (its ``_target_``): the saved run ran
    with what is now its default."""
    saved_nodes = OmegaConf.select(merged, "pipeline.nodes")
    nodes = OmegaConf.select(cfg, "pipeline.nodes")
    if not isinstance(saved_nodes, DictConfig) or not isinstance(nodes, DictConfig):
        return
    written = OmegaConf.to_container(nodes, resolve=False)
    assert isinstance(written, dict)
    for name, node in written.items():
        saved = saved_nodes.get(name)
        if not isinstance(node, dict) or not isinstance(saved, DictConfig):
            continue
        if saved.get("_target_") != node.get("_target_"):
            continue
        with open_dict(saved):
            for key, value in node.items():
                if key not in saved:
                    saved[key] = value


def _delete(cfg: DictConfig, key: str) -> None:
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if isinstance(parent, DictConfig) and leaf in parent:
        with open_dict(parent):
            del parent[leaf]
