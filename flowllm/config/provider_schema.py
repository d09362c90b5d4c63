"""The provider's structured config (``provider.*``): the model endpoint, its wire shapes, and its resilience
(retries, breaker, key pool, rate limit, batch). Part of the schema registered by ``flowllm.config.schema``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from flowllm.config.choice import Choice
from flowllm.errors import DEFAULT_RETRY_ON


@dataclass
class ThinkingConfig:
    mode: str = "disabled"  # enabled | adaptive | disabled
    budget_tokens: int = 10000


@dataclass
class CacheConfig:
    enabled: bool = True
    ttl: str = "5m"  # 5m | 1h (Anthropic)
    breakpoints: int = 4  # Anthropic cache_control breakpoints mark_cache places (1-4, flowllm/nodes/cache.py)


def _default_retry_on() -> list[str]:
    # Transient failures, plus replies that arrived broken (a malformed body, a cut stream, an empty reply):
    # asking again usually works. Never 400/401/403/404, quota or context length (refused at start-up).
    return [str(kind) for kind in DEFAULT_RETRY_ON]


@dataclass
class RetryConfig:
    """One retry policy for every SDK (theirs are off): exponential backoff with full jitter, or the server's
    ``retry-after`` when it sends one."""

    max_attempts: int = 4  # per provider and call, the first try included
    base_delay_s: float = 1.0  # backoff: a random wait in [0, base x 2^(attempt-1)]
    max_delay_s: float = 30.0  # cap of one backoff wait
    max_retry_after_s: float = 60.0  # cap of a server's retry-after / retry-after-ms
    max_total_s: float = 600.0  # stop retrying this provider after this long (then fall back)
    retry_on: list[str] = field(default_factory=_default_retry_on)
    check_reply: bool = True  # retry a malformed or empty reply too (read in the send either way, for its bill)


@dataclass
class BreakerConfig:
    """A circuit breaker per provider: open after ``failure_threshold`` consecutive failed attempts, one trial
    call after ``recovery_timeout_s``; closed again when the trial succeeds."""

    enabled: bool = True
    failure_threshold: int = 5
    recovery_timeout_s: float = 30.0


@dataclass
class KeyPoolConfig:
    cooldown_s: float = 60.0  # how long a key rests after a 429 that names no retry-after
    max_wait_s: float = 60.0  # longest wait for a resting key before this provider counts as unavailable


class ContentFormat(Choice):
    """How message content goes on the wire: ``auto`` sends a plain string when a message is text only (the
    form every compatible server's chat template takes) and a list of parts otherwise; ``string`` joins text
    always (media are then left to degrade_media); ``parts`` always sends a list (OpenAI's and Anthropic's
    own APIs take both)."""

    # lower-case names: OmegaConf matches a YAML value against the member names
    auto = "auto"
    string = "string"
    parts = "parts"


class ForkMode(Choice):
    """Under provider=replay, what a task does at the first turn the saved run cannot answer as asked."""

    live = "live"  # continue live with provider.live (flowllm/providers/fork.py)


class MaxTokensField(Choice):
    max_tokens = "max_tokens"
    max_completion_tokens = "max_completion_tokens"


@dataclass
class WireConfig:
    """Request fields OpenAI's and Anthropic's own APIs accept but some compatible servers refuse: each is sent
    only as configured here (conf/provider/*.yaml set them per server)."""

    # Chat: stream_options.include_usage on streamed calls (usage in the final chunk). Servers that refuse the
    # key: false (usage is then estimated and marked so).
    stream_usage: bool = True
    # Chat and Responses: parallel_tool_calls with native tools; null leaves it out (the server's default).
    parallel_tool_calls: bool | None = None
    # Chat: the name of the output limit, max_tokens (every compatible server) | max_completion_tokens
    # (OpenAI's newer name, required by its reasoning models).
    max_tokens_field: MaxTokensField = MaxTokensField.max_tokens
    # Responses: store (false = stateless, the history is sent every turn); null leaves it out.
    store: bool | None = False
    # Sent as the request's metadata when not empty (OpenAI and Anthropic take it; many servers refuse it).
    metadata: dict[str, str] = field(default_factory=dict)
    # Whether thinking.mode becomes the protocol's reasoning knob (Chat reasoning_effort, Responses
    # reasoning); false for backends that refuse it (vendors with their own flag use extra_body).
    reasoning_effort: bool = True


@dataclass
class HistoryConfig:
    """How the conversation is shaped for chat templates that are strict about it (OpenAI Chat). null: what
    the model family needs (flowllm/providers/wire/models.py: Mistral and Gemma alternate, Mistral's ids)."""

    # Keep user and assistant turns alternating: an assistant message between tool results and a new user
    # message, consecutive user messages joined.
    alternate_roles: bool | None = None
    # Tool-call ids of 9 letters and digits (Mistral's template refuses others), mapped from the server's.
    portable_ids: bool | None = None


@dataclass
class RateLimitConfig:
    """Client-side limits of one provider (flowllm/providers/limiter.py), shared by every task of the process;
    null = no limit. A 429's retry-after pauses every task sending to the provider, not just the one that got
    it."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None  # estimated from the request before it is sent, settled after
    max_in_flight: int | None = None  # requests at once (1 for a single-slot server such as llama.cpp's)


@dataclass
class BatchConfig:
    """Batch mode (flowllm/providers/batch.py): calls of all running tasks go out together through the provider's
    batch API (Anthropic Message Batches), billed at the batch factor of conf/pricing.yaml."""

    enabled: bool = False
    max_size: int = 100  # calls per batch
    max_wait_s: float = 2.0  # a batch goes out this long after its first call at the latest
    poll_s: float = 5.0  # how often a batch is polled until it has ended


@dataclass
class ProviderConfig:
    name: str = MISSING
    protocol: str = "anthropic"  # anthropic | openai_chat | openai_responses | replay
    model: str = MISSING
    base_url: str | None = None
    api_key_env: str | None = None
    auth: str = "bearer"  # bearer | x-api-key (Anthropic-compatible endpoints disagree)
    stream: bool = False
    tool_protocol: str = "xml"  # xml: taught in the system prompt and parsed from text; native: tool schemas
    max_tokens: int = 4096
    temperature: float | None = None
    thinking: ThinkingConfig = field(default_factory=ThinkingConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 120.0
    # The offline emulator: when set, the run starts it on a free loopback port and points base_url at it.
    emulator_script: str | None = None
    # Replay: the run directory whose saved call_model outputs are served.
    run_dir: str | None = None
    # Fork (replay only): fork=live continues each task live with the provider config named by `live` from its
    # first turn that differs from the saved run (or from turn fork_at_turn).
    fork: ForkMode | None = None
    live: str | None = None
    fork_at_turn: int | None = None
    # Resilience (flowllm/providers/resilient.py). api_key_env may list several variables, comma-separated, and
    # a variable may hold several keys, comma-separated: together they are the key pool.
    retry: RetryConfig = field(default_factory=RetryConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    key_pool: KeyPoolConfig = field(default_factory=KeyPoolConfig)
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)
    # Other provider configs (conf/provider/<name>.yaml, optionally "<name>:<model>") tried in order when this
    # one fails or its breaker is open; their own fallbacks follow theirs (a cycle is refused at start-up).
    fallbacks: list[str] = field(default_factory=list)
    # Model registry: alias -> "<provider>[:<model>]" ("" provider = this one). provider.model may be an alias.
    aliases: dict[str, str] = field(default_factory=dict)
    # The model of each agent or sub-agent (CallContext.agent): an alias or "<provider>[:<model>]".
    agent_models: dict[str, str] = field(default_factory=dict)
    # Where provider configs named by fallbacks/aliases are read (default: Hydra's search path under the app,
    # else the project's conf/provider).
    config_dir: str | None = None
    # Emulator fault injection (flowllm/emulator/faults.py), merged over the script's own `faults:` section.
    emulator_faults: dict[str, Any] = field(default_factory=dict)
    # Message shapes and optional request fields for this server (ContentFormat, WireConfig above).
    content_format: ContentFormat = ContentFormat.auto
    wire: WireConfig = field(default_factory=WireConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    # The media the model takes natively; degrade_media turns any other medium into a text description.
    accepts: list[str] = field(default_factory=lambda: ["text", "image"])
    batch: BatchConfig = field(default_factory=BatchConfig)
