"""The provider layer: one ``ModelResponse`` and one history format whatever the wire protocol.

    async with open_provider(provider_config(cfg.provider), resolve=table) as provider:
        request = provider.build_request(system=..., messages=..., tools=...)
        raw = await provider.send(request, context=CallContext(task_id, turn))
        response = provider.normalize(raw)

Protocols: ``anthropic`` (Messages), ``openai_chat`` (Chat Completions), ``openai_responses`` (Responses); any
compatible endpoint is one YAML file in ``conf/provider/``. ``open_provider`` wraps them in the resilience
layer (``resilient.py``): retries, key pools, fallback chains with circuit breakers, the usage ledger.

Providers take a typed ``ProviderConfig`` (``flowllm.config.providers.provider_config`` types a config node) and
read no config file: the providers a config names (fallbacks, aliases...) come from ``resolve``, the
``ProviderTable`` the run's set-up resolved once.
"""

from flowllm.providers.base import BaseProvider
from flowllm.providers.errors import (
    ProviderCallError,
    ProviderConfigError,
    ProviderError,
    ProviderResponseError,
    classify_exception,
)
from flowllm.providers.factory import (
    build_provider,
    check_provider_config,
    known_protocols,
    open_provider,
    provider_secrets,
    register_protocol,
)
from flowllm.providers.fork import check_replay, open_replay_or_fork
from flowllm.providers.ledger import UsageLedger
from flowllm.providers.resilient import ResilientProvider

# The replay provider (provider=replay) serves a saved run's replies; it plugs in like any custom protocol.
register_protocol("replay", open_replay_or_fork, check_replay)

__all__ = [
    "BaseProvider",
    "ProviderCallError",
    "ProviderConfigError",
    "ProviderError",
    "ProviderResponseError",
    "ResilientProvider",
    "UsageLedger",
    "build_provider",
    "check_provider_config",
    "classify_exception",
    "known_protocols",
    "open_provider",
    "provider_secrets",
    "register_protocol",
]
