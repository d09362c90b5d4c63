"""Opening a configured provider: key lookup, the offline emulator, the SDK clients, the resilience layer.

``check_provider_config`` runs before any task starts and raises ``ProviderConfigError`` with one line that
says what to do: for the provider and for every provider its fallbacks, aliases and agent models name (an
unknown name, a cycle, a key pool with no key, an invalid retry or breaker setting). ``open_provider`` is the
async context manager the experiment holds for the whole run: a ``ResilientProvider`` (retries, key pools,
fallbacks, breakers, the usage ledger) over one SDK client per key and provider; with ``emulator_script`` set
it also runs the loopback emulator (with its fault injection) for that lifetime and points the SDK at it.

A new wire protocol is one ``register_protocol`` call (the replay provider plugs in the same way), or, from an
installed package, an entry point of the group ``flowllm.protocols`` naming a ``ProtocolEntry`` or its opener.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowllm.config.provider_schema import ProviderConfig
from flowllm.core.interfaces import Provider
from flowllm.core.registry import Registry, unknown_choice
from flowllm.providers.adaptive.aimd import AdaptiveConcurrency
from flowllm.providers.base import BaseProvider
from flowllm.providers.batch import BatchRoutes, batch_journal, check_batch_config, open_batcher
from flowllm.providers.breaker import CircuitBreaker, check_breaker_config
from flowllm.providers.clients import ClientShards, once
from flowllm.providers.errors import ProviderConfigError
from flowllm.providers.keys import (
    KeyPool,
    KeySlot,
    check_key_pool,
    check_key_pool_config,
    load_keys,
    secret_values,
)
from flowllm.providers.ledger import UsageLedger
from flowllm.providers.limiter import SharedLimits, build_limiter, check_rate_limit_config
from flowllm.providers.registry import Resolver, RoutePlan, plan_routes
from flowllm.providers.resilient import ResilientProvider, Route, breaker_listener
from flowllm.providers.retry import RetryPolicy
from flowllm.resources import bundled

log = logging.getLogger(__name__)

# Sent instead of a key to servers that need none (the emulator, a local vLLM/SGLang/Ollama): the SDKs insist
# on having one.
DUMMY_KEY = "flowllm-no-key"
NO_KEY_PROVIDERS = frozenset({"local", "offline"})


@dataclass(frozen=True)
class Endpoint:
    """Where and how to reach the server: the resolved base URL and key (never logged, never saved)."""

    base_url: str | None
    api_key: str

    def __repr__(self) -> str:
        return f"Endpoint(base_url={self.base_url!r}, api_key=<hidden>)"


ProviderBuilder = Callable[[ProviderConfig, Endpoint], BaseProvider]

# SDK clients per provider, tasks spread over them by id (see BaseProvider.clients): at 500 concurrent tasks,
# about 30 connections per pool instead of 500.
CLIENT_SHARDS = 16


@dataclass(frozen=True)
class Opening:
    """What ``open_provider`` was given, handed to a custom opener that opens providers of its own (a fork
    opens its live provider with the run's ledger and resolver)."""

    ledger: UsageLedger
    resolve: Resolver | None
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[Any]]


CustomOpener = Callable[[ProviderConfig, Opening], Awaitable[Provider]]
# Checks a custom protocol's settings before anything opens; raises ProviderConfigError with what to do.
CustomCheck = Callable[[ProviderConfig, Resolver | None], None]


def _build_anthropic(cfg: ProviderConfig, endpoint: Endpoint) -> BaseProvider:
    from flowllm.providers.wire.anthropic import AnthropicProvider

    tls = once(_tls_context)

    def make() -> Any:
        import anthropic

        kwargs: dict[str, Any] = {"base_url": endpoint.base_url, "max_retries": 0, "timeout": cfg.timeout_s}
        kwargs["api_key"] = endpoint.api_key
        if cfg.auth == "x-api-key":
            # anthropic 2.x sends Authorization: Bearer; endpoints that want x-api-key get it as a header
            # instead, with the bearer header omitted (never both).
            kwargs["default_headers"] = {"x-api-key": endpoint.api_key, "Authorization": anthropic.Omit()}
        return anthropic.AsyncAnthropic(**kwargs, http_client=anthropic.DefaultAsyncHttpxClient(verify=tls()))

    return AnthropicProvider(cfg, ClientShards(make, CLIENT_SHARDS, base_url=endpoint.base_url or ""))


def _tls_context() -> Any:
    """One TLS context for all of a provider's client shards: loading the CA store costs tens of ms each."""
    import httpx2

    return httpx2.create_ssl_context()


def _openai_shards(cfg: ProviderConfig, endpoint: Endpoint) -> ClientShards:
    tls = once(_tls_context)

    def make() -> Any:
        import openai

        return openai.AsyncOpenAI(
            api_key=endpoint.api_key,
            base_url=endpoint.base_url,
            max_retries=0,
            timeout=cfg.timeout_s,
            http_client=openai.DefaultAsyncHttpxClient(verify=tls()),
        )

    return ClientShards(make, CLIENT_SHARDS, base_url=endpoint.base_url or "")


def _build_openai_chat(cfg: ProviderConfig, endpoint: Endpoint) -> BaseProvider:
    from flowllm.providers.wire.openai_chat import OpenAIChatProvider

    return OpenAIChatProvider(cfg, _openai_shards(cfg, endpoint))


def _build_openai_responses(cfg: ProviderConfig, endpoint: Endpoint) -> BaseProvider:
    from flowllm.providers.wire.openai_responses import OpenAIResponsesProvider

    return OpenAIResponsesProvider(cfg, _openai_shards(cfg, endpoint))


@dataclass(frozen=True)
class ProtocolEntry:
    """How a ``provider.protocol`` is served: an SDK wire protocol has a ``build`` (one provider per key, behind
    the resilient chain); anything else (``replay``) an ``open`` that returns the whole Provider, and optionally
    a ``check`` of its settings that ``check_provider_config`` runs."""

    build: ProviderBuilder | None = None
    open: CustomOpener | None = None
    check: CustomCheck | None = None


def _protocol_entry(name: str, loaded: Any) -> ProtocolEntry:
    """A plug-in protocol: a ``ProtocolEntry``, or the ``open`` function of one."""
    if isinstance(loaded, ProtocolEntry):
        return loaded
    if callable(loaded):
        return ProtocolEntry(open=loaded)
    raise TypeError(f"expected a flowllm.providers.factory.ProtocolEntry or an opener function, got {loaded!r}")


PROTOCOLS: Registry[ProtocolEntry] = Registry(
    "provider.protocol",
    {
        "anthropic": ProtocolEntry(build=_build_anthropic),
        "openai_chat": ProtocolEntry(build=_build_openai_chat),
        "openai_responses": ProtocolEntry(build=_build_openai_responses),
    },
    group="flowllm.protocols",
    error=ProviderConfigError,
    adapt=_protocol_entry,
)


def register_protocol(name: str, opener: CustomOpener, check: CustomCheck | None = None) -> None:
    """Plug in a provider that is not an SDK wire protocol (``replay``): ``opener(cfg, opening)`` returns the
    Provider; ``check(cfg, resolve)``, if given, runs in ``check_provider_config``."""
    PROTOCOLS.register(name, ProtocolEntry(open=opener, check=check))


def _custom(protocol: str) -> CustomOpener | None:
    entry = PROTOCOLS.get(protocol)
    return entry.open if entry is not None else None


def known_protocols() -> list[str]:
    return PROTOCOLS.names()


def resolve_script(path: str) -> Path:
    """The emulator script: as given (relative to the working directory), else a bundled one (resources.py)."""
    candidate = bundled(path)
    if candidate.is_file():
        return candidate
    raise ProviderConfigError(f"provider.emulator_script: file not found: {path}")


def _needs_key(cfg: ProviderConfig) -> bool:
    return not cfg.emulator_script and cfg.name not in NO_KEY_PROVIDERS and bool(cfg.api_key_env)


def check_provider_config(pcfg: ProviderConfig, *, resolve: Resolver | None = None) -> RoutePlan | None:
    """Raise ``ProviderConfigError`` if ``cfg`` (or any provider it falls back to) cannot work; opens
    nothing, calls nothing. Returns the resolved chains (None for a custom protocol such as replay)."""
    _check_one(pcfg)
    entry = PROTOCOLS.get(pcfg.protocol)
    if entry is not None and entry.open is not None:
        if entry.check is not None:
            entry.check(pcfg, resolve)
        return None
    plan = plan_routes(pcfg, resolve)
    for member in plan.members.values():
        if _custom(member.cfg.protocol) is not None:
            raise ProviderConfigError(
                f"provider '{member.id}' (protocol {member.cfg.protocol}) cannot be a fallback or an alias target"
            )
        if member.cfg is not pcfg:
            try:
                _check_one(member.cfg)
            except ProviderConfigError as exc:
                raise ProviderConfigError(f"fallback/alias '{member.id}': {exc}") from None
    return plan


def _check_one(pcfg: ProviderConfig) -> None:
    PROTOCOLS.require(pcfg.protocol)
    if _custom(pcfg.protocol) is not None:
        return
    for key, value, allowed in (
        ("provider.tool_protocol", pcfg.tool_protocol, ("xml", "native")),
        ("provider.thinking.mode", pcfg.thinking.mode, ("enabled", "adaptive", "disabled")),
        ("provider.auth", pcfg.auth, ("bearer", "x-api-key")),
        ("provider.cache.ttl", pcfg.cache.ttl, ("5m", "1h")),
    ):
        if value not in allowed:
            raise ProviderConfigError(unknown_choice(key, value, allowed))
    RetryPolicy.from_config(pcfg.retry, provider=pcfg.name)
    check_batch_config(pcfg)
    check_breaker_config(pcfg.breaker, provider=pcfg.name)
    check_key_pool_config(pcfg.key_pool, provider=pcfg.name)
    check_rate_limit_config(pcfg.rate_limit, provider=pcfg.name)
    if pcfg.emulator_script:
        from flowllm.emulator.faults import FaultConfigError, FaultPlan
        from flowllm.emulator.script import Script, ScriptError

        try:
            script = Script.load(resolve_script(pcfg.emulator_script))
            FaultPlan.parse(FaultPlan.merge(script.faults, pcfg.emulator_faults), "provider.emulator_faults")
        except (ScriptError, FaultConfigError) as exc:
            raise ProviderConfigError(str(exc)) from None
        return
    if pcfg.emulator_faults:
        raise ProviderConfigError(f"provider '{pcfg.name}': emulator_faults needs provider.emulator_script")
    if _needs_key(pcfg):
        check_key_pool(pcfg.api_key_env, pcfg.name)
    if pcfg.name == "local" and not pcfg.base_url:
        raise ProviderConfigError("provider 'local' needs provider.base_url (e.g. http://127.0.0.1:8000/v1)")


def provider_secrets(pcfg: ProviderConfig, *, resolve: Resolver | None = None) -> list[str]:
    """Every API key the run may send (the provider's pool and those of its fallbacks, aliases and agent
    models), one by one: what the recorder must mask."""
    plan = check_provider_config(pcfg, resolve=resolve)
    configs = [pcfg] if plan is None else [pcfg, *(m.cfg for m in plan.members.values())]
    values: list[str] = []
    for member in configs:
        values.extend(v for v in secret_values(member.api_key_env) if v not in values)
    return values


def build_provider(
    pcfg: ProviderConfig,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
) -> BaseProvider:
    """A provider on an explicit endpoint (``open_provider`` resolves it from config and environment)."""
    entry = PROTOCOLS.get(pcfg.protocol)
    builder = entry.build if entry is not None else None
    if builder is None:
        raise ProviderConfigError(f"provider '{pcfg.name}': unknown protocol '{pcfg.protocol}'")
    return builder(pcfg, Endpoint(base_url or pcfg.base_url, api_key or DUMMY_KEY))


@asynccontextmanager
async def open_provider(
    pcfg: ProviderConfig,
    *,
    ledger: UsageLedger | None = None,
    resolve: Resolver | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    limits: SharedLimits | None = None,
    adaptive: AdaptiveConcurrency | None = None,
) -> AsyncIterator[Provider]:
    """The configured provider, open for the lifetime of the context (and the emulators with it, if
    scripted).

    ``ledger``: where every attempt is written (``UsageLedger(run_dir / "usage.jsonl", prices=...)``); without
    one the ledger is kept in memory (``provider.ledger``). ``resolve`` maps a provider name to its config (a
    ``ProviderTable`` the run's set-up resolved; without one, a name fails); ``clock`` and ``sleep`` drive
    breakers, key cooldowns and retry waits; ``limits``: where the rate limits' shared state is kept (default:
    this machine's, ``FileLimits``; Redis with ``experiment.coordination``). ``adaptive``: the run's adaptive
    limits of calls in flight (``experiment.max_concurrent=auto``), one per provider and model.
    """
    plan = check_provider_config(pcfg, resolve=resolve)
    ledger = ledger if ledger is not None else UsageLedger(None)
    custom = _custom(pcfg.protocol)
    if custom is not None or plan is None:
        assert custom is not None
        provider = await custom(pcfg, Opening(ledger, resolve, clock, sleep))
        try:
            yield provider
        finally:
            await provider.aclose()
        return

    async with AsyncExitStack() as stack:
        routes: dict[str, Route] = {}
        for member_id, member in plan.members.items():
            routes[member_id] = await stack.enter_async_context(
                _open_route(
                    member_id, member.cfg, ledger=ledger, clock=clock, sleep=sleep, limits=limits, adaptive=adaptive
                )
            )
        yield ResilientProvider(plan, routes, ledger=ledger, clock=clock, sleep=sleep)


def _route_keys(cfg: ProviderConfig) -> list[KeySlot]:
    """The key pool of a provider: its configured keys, else the placeholder key servers without auth get."""
    slots, _ = load_keys(cfg.api_key_env)  # check_provider_config made sure a provider that needs one has one
    return slots or [KeySlot("(no key)", DUMMY_KEY)]


@asynccontextmanager
async def _open_route(
    member_id: str,
    cfg: ProviderConfig,
    *,
    ledger: UsageLedger,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[Any]],
    limits: SharedLimits | None = None,
    adaptive: AdaptiveConcurrency | None = None,
) -> AsyncIterator[Route]:
    emulator = None
    base_url = cfg.base_url
    routes: BatchRoutes = {}  # the batched calls' custom ids -> task, agent, turn (ours: never sent)
    if cfg.emulator_script:
        from flowllm.emulator import Emulator
        from flowllm.emulator.faults import FaultPlan
        from flowllm.emulator.script import Script

        script = Script.load(resolve_script(cfg.emulator_script))
        faults = FaultPlan.parse(FaultPlan.merge(script.faults, cfg.emulator_faults), "provider.emulator_faults")
        emulator = Emulator(script, faults=faults, batch_routes=routes)
        await asyncio.to_thread(emulator.start)
        base_url = emulator.base_url if cfg.protocol == "anthropic" else emulator.openai_base_url
    providers: dict[str, BaseProvider] = {}
    try:
        slots = _route_keys(cfg)
        journal = batch_journal(cfg, ledger.path)
        for slot in slots:
            providers[slot.label] = build_provider(cfg, base_url=base_url, api_key=slot.value)
            providers[slot.label].prepare()
            if journal is not None:
                providers[slot.label].batcher = open_batcher(providers[slot.label], cfg, journal, sleep, routes)
        for note in next(iter(providers.values())).shaping_notes():  # once per run and provider, not per call
            log.warning(note)
        policy = RetryPolicy.from_config(cfg.retry, provider=member_id)
        yield Route(
            id=member_id,
            cfg=cfg,
            providers=providers,
            pool=KeyPool(
                slots,
                cfg.key_pool,
                provider=member_id,
                max_retry_after_s=policy.max_retry_after_s,
                clock=clock,
                sleep=sleep,
                on_event=ledger.write,
            ),
            breaker=CircuitBreaker(
                member_id, cfg.breaker, clock=clock, sleep=sleep, on_transition=breaker_listener(ledger)
            ),
            policy=policy,
            limiter=build_limiter(
                cfg.rate_limit,
                provider=member_id,
                clock=clock,
                sleep=sleep,
                limits=limits,
                adaptive=adaptive.flight(member_id, cfg.model) if adaptive is not None else None,
            ),
        )
    finally:
        for provider in providers.values():
            await provider.aclose()
        if emulator is not None:
            await asyncio.to_thread(emulator.stop)
