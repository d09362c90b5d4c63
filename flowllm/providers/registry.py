"""The model registry: provider configs by name, aliases, fallback chains and each agent's model.

A *route spec* names a model the way config does: ``"<provider>[:<model>]"``, where ``<provider>`` is a file
``conf/provider/<provider>.yaml`` and ``<model>`` overrides its ``model`` (``deepseek:deepseek-reasoner``).
An empty provider part (``":claude-haiku-4-5"``) means the configured provider itself.

* ``provider.aliases``: ``{fast: "deepseek", smart: "claude:claude-opus-4-5"}``. ``provider.model`` may be an
  alias (``provider.model=fast``): the run then uses the alias's provider and model.
* ``provider.fallbacks``: ``[gpt5, deepseek]``, tried in that order; each fallback's own fallbacks follow it
  (depth first). A cycle, an unknown name or a chain that resolves to the same provider twice is refused at
  start-up with the chain spelled out.
* ``provider.agent_models``: ``{main: smart, browser: fast}``: the chain a given agent or sub-agent
  (``CallContext.agent``) is served by; agents not listed use the main chain.

A name is turned into its config by a ``Resolver``: the run's set-up reads each one once where the config is
loaded (``flowllm.config.providers``) and hands the providers a ``ProviderTable`` of them; this module reads no
file.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flowllm.config.provider_schema import ProviderConfig
from flowllm.errors import ConfigError
from flowllm.providers.errors import ProviderConfigError

log = logging.getLogger(__name__)

MAIN_AGENT = "main"

Resolver = Callable[[str], ProviderConfig]


@dataclass(frozen=True)
class RouteSpec:
    provider: str  # config name; "" = the configured provider
    model: str | None

    @classmethod
    def parse(cls, text: str) -> RouteSpec:
        name, sep, model = str(text).strip().partition(":")
        if not name and not model:
            raise ProviderConfigError(f"'{text}' is not a model spec (expected <provider>[:<model>])")
        return cls(name.strip(), (model.strip() or None) if sep else None)


@dataclass(frozen=True)
class ProviderTable:
    """The provider configs a run names (fallbacks, aliases, agent models, judge, vision, a fork's live
    provider), each read once by the run's set-up (``flowllm.config.providers``): a resolver that reads no file."""

    configs: Mapping[str, ProviderConfig] = field(default_factory=dict)

    def __call__(self, name: str) -> ProviderConfig:
        cfg = self.configs.get(name)
        if cfg is None:
            known = ", ".join(sorted(self.configs)) or "none"
            raise ProviderConfigError(
                f"provider '{name}' was not resolved before the run (resolved: {known}); name it in the "
                "provider config the run was prepared with (provider.fallbacks, aliases, agent_models, judge.provider)"
            )
        return copy.deepcopy(cfg)  # the planner adjusts what it is given (model, tool_protocol)


@dataclass
class Member:
    """One provider of a chain, resolved: ``id`` is how config referred to it (and how the ledger names it)."""

    id: str
    cfg: ProviderConfig


@dataclass
class RoutePlan:
    members: dict[str, Member] = field(default_factory=dict)
    chains: dict[str, list[str]] = field(default_factory=dict)  # agent -> member ids; MAIN_AGENT always present

    def chain(self, agent: str) -> list[Member]:
        ids = self.chains.get(agent) or self.chains[MAIN_AGENT]
        return [self.members[i] for i in ids]


def _identity(cfg: ProviderConfig) -> tuple[str, str, str, str | None, str | None]:
    return (cfg.name, cfg.protocol, cfg.model, cfg.base_url, cfg.emulator_script)


class _Planner:
    def __init__(self, primary: ProviderConfig, resolve: Resolver) -> None:
        self.primary = primary
        self.configured = primary  # the config the user chose: what an empty provider part in a spec means
        self.resolve = resolve
        self.plan = RoutePlan()

    def _target(self, spec_text: str) -> tuple[str, ProviderConfig]:
        """(member id, config) of a spec or alias."""
        text = str(spec_text).strip()
        alias = self.configured.aliases.get(text)
        if alias is not None:
            text = str(alias).strip()
            if text in self.configured.aliases:
                raise ProviderConfigError(f"provider.aliases: '{spec_text}' points at another alias '{text}'")
        spec = RouteSpec.parse(text)
        if spec.provider in ("", self.configured.name):
            # Another model of the configured provider: its settings, but not its fallbacks (they would lead
            # straight back here).
            base = copy.deepcopy(self.configured)
            base.fallbacks = []
            base.aliases, base.agent_models = {}, {}
            name = self.configured.name
        else:
            try:
                base = self.resolve(spec.provider)
            except ConfigError as exc:  # the loader's: an unknown name, a file that does not fit the schema
                raise ProviderConfigError(str(exc)) from None
            name = spec.provider
        if spec.model:
            base.model = spec.model
            return f"{name}:{spec.model}", base
        return name, base

    def _add(self, member_id: str, cfg: ProviderConfig) -> None:
        existing = self.plan.members.get(member_id)
        if existing is None:
            if cfg.tool_protocol != self.primary.tool_protocol:
                # The prompt is built once, for the primary's tool protocol; every provider must read it alike.
                log.info(
                    "provider '%s': tool_protocol %s -> %s (as the primary)",
                    member_id,
                    cfg.tool_protocol,
                    self.primary.tool_protocol,
                )
                cfg.tool_protocol = self.primary.tool_protocol
            self.plan.members[member_id] = Member(member_id, cfg)

    def chain_from(self, head_id: str, head: ProviderConfig) -> list[str]:
        out: list[str] = []
        seen: dict[tuple[Any, ...], str] = {}

        def visit(member_id: str, cfg: ProviderConfig, path: tuple[str, ...]) -> None:
            if member_id in path:
                cycle = " -> ".join((*path, member_id))
                raise ProviderConfigError(f"provider.fallbacks: the chain has a cycle: {cycle}")
            ident = _identity(cfg)
            if ident in seen and seen[ident] in path:
                raise ProviderConfigError(
                    f"provider.fallbacks: the chain has a cycle: {' -> '.join((*path, member_id))} "
                    f"('{member_id}' is '{seen[ident]}' again)"
                )
            if member_id in out:  # reached twice without a cycle (a diamond): tried once, first place
                return
            seen[ident] = member_id
            self._add(member_id, cfg)
            out.append(member_id)
            for entry in cfg.fallbacks:
                child_id, child = self._target(entry)
                visit(child_id, child, (*path, member_id))

        visit(head_id, head, ())
        return out

    def build(self) -> RoutePlan:
        primary = self.primary
        if primary.model in primary.aliases:
            head_id, head = self._target(primary.model)
            # The alias's provider takes over, but the registry of the config the user chose stays in force.
            head.aliases = {**head.aliases, **primary.aliases}
            head.agent_models = {**head.agent_models, **primary.agent_models}
            head.tool_protocol = primary.tool_protocol
            self.primary = head
        else:
            head_id, head = primary.name, primary
        self.plan.chains[MAIN_AGENT] = self.chain_from(head_id, head)
        for agent, spec in self.primary.agent_models.items():
            agent_id, agent_cfg = self._target(spec)
            self.plan.chains[str(agent)] = self.chain_from(agent_id, agent_cfg)
        return self.plan


def plan_routes(primary: ProviderConfig, resolve: Resolver | None = None) -> RoutePlan:
    """Resolve aliases, fallback chains and agent models of ``primary``; raises ``ProviderConfigError``."""
    return _Planner(primary, resolve or ProviderTable()).build()
