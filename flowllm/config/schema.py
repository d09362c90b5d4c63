"""Structured configs: the typed shape of everything under ``conf/``.

Registered in Hydra's ConfigStore (see ``register_configs``) as the schema each config group's YAML files extend
through their ``defaults`` list, so a wrong type or a missing field fails when Hydra composes the config, before
any task starts. Field names are the overrides users type (``provider.model``, ``agent.max_turns``, ...): keep them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from flowllm.config.answer_sources import DEFAULT_BLOCK
from flowllm.config.choice import Choice
from flowllm.config.provider_schema import (
    ProviderConfig,
)
from flowllm.core.timeouts import FANOUT_TIMEOUT_S, ITEM_TIMEOUT_S


@dataclass
class RepairConfig:
    name: str = MISSING
    stages: list[str] = field(default_factory=list)


@dataclass
class RunnerConfig:
    name: str = MISSING  # legacy | graph | graph_parallel
    item_timeout_s: float = ITEM_TIMEOUT_S  # per fan-out item (one tool call or sub-agent): a safety net
    fanout_timeout_s: float = FANOUT_TIMEOUT_S  # all fan-out items of one node together
    turn_timeout_s: float | None = None  # deprecated: the old name of fanout_timeout_s (said once when set)


@dataclass
class PipelineConfig:
    name: str = MISSING
    # Node name -> node config ({_target_: ..., inputs?: {port: state_key}, outputs?: {port: state_key}, ...}).
    nodes: dict[str, Any] = MISSING
    # Hooks (flowllm/engine/hooks.py): hook point -> nodes inserted there, each a name from hook_nodes or an
    # inline node config, e.g. pipeline.hooks.before_model=[log_requests].
    hooks: dict[str, list[Any]] = field(default_factory=dict)
    # Named hook nodes ({point, enabled?, _target_, ...}); those with enabled: true are inserted without being
    # listed in hooks (memory, compaction).
    hook_nodes: dict[str, Any] = field(default_factory=dict)
    # Hook point -> the state keys it sits on; merged over flowllm.engine.hooks.DEFAULT_POINTS.
    hook_points: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class ToolServerConfig:
    """One MCP server (flowllm/tools/client/settings.py reads it; unknown keys are refused there)."""

    command: str | None = None  # a local server over stdio...
    url: str | None = None  # ...or a remote one: streamable HTTP, or SSE with transport: sse
    transport: str | None = None  # stdio | streamable_http | sse; default: stdio with a command, else HTTP
    # HTTP header -> the environment variable holding its value (keys never live in config files).
    headers: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None  # the server's working directory; ${workspace} (also in args, env) is the task folder
    timeout_s: float = 60.0
    blacklist: list[str] = field(default_factory=list)
    # Tools that need a key are optional: a missing variable disables the server with a warning.
    requires_env: list[str] = field(default_factory=list)
    scope: str | None = None  # task | run; default: tools.scope
    # Re-run a call after the server crashed mid-call even when the tool is not annotated idempotent.
    retry_on_crash: bool = False


@dataclass
class SearchToolConfig:
    # tool-search (conf/tools/web.yaml): serper | brave | tavily | searxng; each backend's key variable is
    # in flowllm/tools/search.py (KEY_ENV), never here.
    backend: str = "serper"
    searxng_url: str = ""


@dataclass
class AudioToolConfig:
    # tool-audio: an OpenAI-compatible audio.transcriptions endpoint (empty base_url: OpenAI's) and the variable
    # holding its key; emulator=true answers from provider.emulator_script instead (offline runs).
    base_url: str = ""
    model: str = "whisper-1"
    api_key_env: str = "OPENAI_API_KEY"
    emulator: bool = False


@dataclass
class VisionToolConfig:
    # tool-vision.ask_image (flowllm/agent/vision.py): one multimodal call through the provider layer, recorded
    # like a sub-agent. provider: a conf/provider name, optionally "<name>:<model>"; null: the run's provider.
    enabled: bool = False
    provider: str | None = None
    max_image_mb: float = 5.0
    timeout_s: float = 300.0
    system_prompt: str = ""  # empty: the built-in prompt (flowllm/agent/vision.py)
    # The named provider's emulator_script, replaced (offline runs whose vision model is another emulator).
    emulator_script: str | None = None


class SamplingMode(Choice):
    """What the client answers to a server's ``sampling/createMessage`` (flowllm/tools/client/sampling.py)."""

    decline = "decline"  # an MCP error the server can pass on: do the work without a model
    answer = "answer"  # task-scoped servers: one call to the run's provider, recorded as agent "sampling"


@dataclass
class WebGuardConfig:
    # Benchmark answer sources the web tools refuse (flowllm/tools/web/guard.py): "host" or "host/path" entries,
    # matched after redirects; the default is flowllm/config/answer_sources.py's list.
    block: list[str] = field(default_factory=lambda: list(DEFAULT_BLOCK))
    # Regular expressions the contamination audit also looks for in what came from outside a task's own files
    # (flowllm/export/contamination.py), beside the task's normalised ground truth.
    answer_patterns: list[str] = field(default_factory=list)


@dataclass
class ToolsConfig:
    name: str = MISSING
    # Entries follow ToolServerConfig, checked by flowllm/tools/client/settings.py (one line per mistake). Typed Any so
    # that `+tools.servers.NAME={url: ...}` can add a server: OmegaConf refuses a dict for a dataclass value.
    servers: dict[str, Any] = field(default_factory=dict)
    call_timeout_s: float = 60.0
    max_result_chars: int = 20000
    scope: str = "task"  # task | run: how long a server process lives (a server's own scope wins)
    # Hand the per-task key-value store (flowllm/tools/state.py) to tools that ask for it.
    task_state: bool = False
    search: SearchToolConfig = field(default_factory=SearchToolConfig)
    audio: AudioToolConfig = field(default_factory=AudioToolConfig)
    vision: VisionToolConfig = field(default_factory=VisionToolConfig)
    # Start the loopback web fixture server (flowllm/emulator/web.py) for the run's *.web.test pages.
    web_fixtures: bool = False
    web: WebGuardConfig = field(default_factory=WebGuardConfig)
    # A server's `instructions` join the tool manual, cut to this many characters (0: left out).
    instructions_max_chars: int = 2000
    # Sampling requests from servers: decline, or answer those of task-scoped servers with the run's provider.
    sampling: SamplingMode = SamplingMode.decline


@dataclass
class CompactionConfig:
    """compact_history (flowllm/nodes/compaction.py): past a threshold, older turns become a model-written
    summary."""

    enabled: bool = False
    threshold_tokens: int | None = None  # compact when the context passes this many tokens...
    threshold_fraction: float = 0.8  # ...or, when null, this fraction of agent.max_context_tokens
    keep_turns: int = 2  # the latest assistant turns kept verbatim
    agent: str = "compactor"  # CallContext.agent of the summary call: route it with provider.agent_models
    max_result_chars: int = 2000  # of each tool result, in the transcript the summariser reads
    max_summary_tokens: int = 1024


@dataclass
class EmbeddingConfig:
    kind: str = "hashing"  # hashing (offline, no download) | openai (any OpenAI-compatible /embeddings)
    dim: int = 512  # hashing: vector size; openai: requested dimensions when set by `dimensions`
    model: str = "text-embedding-3-small"
    base_url: str | None = None
    api_key_env: str | None = None
    dimensions: int | None = None
    timeout_s: float = 30.0


@dataclass
class MemoryConfig:
    """Long-term memory (flowllm/memory): recall_memory before the model, remember at the end of a task."""

    enabled: bool = False
    path: str = "runs/memory.sqlite"  # the persistent store, relative to the working directory
    namespace: str = "default"
    top_k: int = 5
    min_score: float = 0.25  # cosine similarity a memory needs to be recalled
    include_current_run: bool = False  # recall memories written by this run's other tasks (order-dependent)
    remember: list[str] = field(default_factory=lambda: ["answer", "tagged"])
    max_block_chars: int = 4000
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)


@dataclass
class LimitsConfig:
    """Per-task limits (flowllm/spend/spending.py), null = none: a task that reaches one ends after the turn
    in progress with status ``limit`` and the limit named."""

    tokens: int | None = None  # input + output tokens of every model call of the task
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int | None = None  # the main agent's turns
    wall_s: float | None = None
    working_s: float | None = None  # wall time minus time queued behind rate limits, back-off and breakers
    score_partial: bool = True  # score the answer a limited task gave, like any completed task's


@dataclass
class AgentConfig:
    max_turns: int = 10
    keep_tool_result: int = -1  # how many of the latest tool results trim_history keeps; -1 keeps all
    # Blank old tool results this many at a time (keep_tool_result..keep_tool_result+trim_block-1 stay whole):
    # the prompt's prefix then changes every trim_block turns, not every turn, and the cache is read between.
    trim_block: int = 1
    # The prompt's token budget: trim_history blanks the oldest tool results (then drops the oldest turns) until
    # the request fits. null: no budget.
    max_context_tokens: int | None = None
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    system_prompt: str = ""
    summary_prompt: str = (
        "You have reached the turn limit. Do not call any tool. Give your final answer now, wrapped in \\boxed{}."
    )


@dataclass
class SubAgentConfig:
    """A sub-agent, offered to the main agent as the tool ``agent-<name>.execute_subtask(subtask)``."""

    description: str = MISSING
    system_prompt: str = ""
    max_turns: int = 5
    servers: list[str] | None = None  # tool servers it may use (None: all of the task's)
    timeout_s: float = 600.0  # the whole sub-agent conversation, as one tool call


@dataclass
class DatasetConfig:
    path: str = MISSING
    limit: int | None = None
    levels: list[int] | None = None
    task_ids: list[str] | None = None
    # auto: metadata.jsonl (GAIA's own) if present, else standardized_data.jsonl; or gaia | standardized.
    format: str = "auto"
    # How rows become tasks (flowllm/datasets/adapters.py): gaia (the two GAIA layouts) | table (a JSONL, JSON,
    # CSV, TSV or Parquet file, or a folder of them, read through the mappings below).
    adapter: str = "gaia"
    # Task field (id, question, answer, attachment, level) -> column; a dotted path reads into nested values.
    fields: dict[str, str] = field(default_factory=dict)
    # Metadata name -> column, kept with each task; the names in `breakdown` split the summary's accuracy.
    metadata: dict[str, str] = field(default_factory=dict)
    breakdown: list[str] = field(default_factory=list)
    # Encrypted columns (BrowseComp: sha256_xor, xbench: xor), keyed by the row's canary column or `canary`.
    decrypt: str = "none"
    encrypted: list[str] = field(default_factory=list)
    canary_column: str = "canary"
    canary: str | None = None
    # Rows with a non-empty value in any of these columns are left out (HLE's image questions).
    skip_nonempty: list[str] = field(default_factory=list)
    id_prefix: str = "task"  # ids "<prefix>-0001", ... when fields.id is not set
    # The question the agent sees: str.format with {question} and the metadata names ("" = the question).
    question_template: str = ""
    # How answers are scored (flowllm/scoring): gaia | exact | judge (an LLM judge, see JudgeConfig).
    scorer: str = "gaia"
    # The missing-data message: where to get the file and where to put it.
    source_hint: str = ""


@dataclass
class JudgeConfig:
    """The LLM judge of ``dataset.scorer=judge``: a provider config by name, called through the provider layer
    (retries, fallbacks, the ledger), recorded under ``tasks/<id>/judge/`` and counted apart from the agent."""

    provider: str | None = None  # conf/provider/<name>.yaml, optionally "<name>:<model>"
    template: str = "simpleqa"  # the published grader the prompt follows: browsecomp | simpleqa | hle
    max_tokens: int = 1024
    # Overrides of the judge provider's emulator_script (offline fixtures) and run_dir (judge.provider=replay).
    emulator_script: str | None = None
    run_dir: str | None = None


class Executor(Choice):
    """Where the workers of one run (experiment.workers) run."""

    local = "local"
    ray = "ray"


class Reducer(Choice):
    """How a task's epochs become its score (flowllm/scoring/stats.py)."""

    mean = "mean"  # the fraction of scored epochs that were correct
    majority = "majority"  # the verdict of the most frequent normalised answer
    max = "max"  # 1 when any epoch was correct
    all = "all"  # 1 when every epoch was correct (pass^k)


class IntervalMethod(Choice):
    """The 95% interval of an accuracy: wilson (binary scores, not clustered; clt otherwise), clt (normal), or
    bootstrap (percentile, resampling tasks or clusters, with a fixed seed)."""

    wilson = "wilson"
    clt = "clt"
    bootstrap = "bootstrap"


@dataclass
class BudgetConfig:
    """The run's budget over its whole ledger (flowllm/spend/spending.py), null = none: once reached no task
    starts, running ones end with status ``budget``, exit 3; a rerun with a higher budget resumes."""

    cost_usd: float | None = None
    tokens: int | None = None


@dataclass
class ExperimentConfig:
    name: str = "sample"
    # Tasks at once: a whole number, or auto / auto:N (up to N tasks, default 64, and the calls in flight per
    # provider and model found by AIMD: flowllm/providers/adaptive/aimd.py). `flowllm ctl RUN set` changes it.
    max_concurrent: Any = 4
    task_timeout_s: float = 900.0
    attempts: int = 1  # pass@k: up to k attempts per task, stopping at the first correct answer
    # Independent repeats of every task (tasks/<id>/epochs/<n>/), reduced to one score per task by
    # epoch_reducer: mean | majority (vote on the normalised answer) | max | all (pass^k). flowllm/scoring/stats.py
    epochs: int = 1
    epoch_reducer: Reducer = Reducer.mean
    # true: skip tasks whose result.json says completed (rerun into the same hydra.run.dir), refused when the
    # folder's results came from other settings (flowllm/setup/fingerprint.py); false: run every task
    # again; force: resume even so, recording both settings' fingerprints.
    resume: Any = True
    # When stderr is not a terminal: one plain progress line at most this often (plus the first and the last).
    progress_interval_s: float = 10.0
    pricing: str = "conf/pricing.yaml"  # USD per million tokens, per model; relative to cwd, else the project
    # Who the usage ledger charges (its "user" dimension); unset: $FLOWLLM_USER, else the login name.
    user: str | None = None
    # Worker processes on this machine (flowllm/experiment/workers.py): a whole number >= 1, or auto (the usable
    # cores). Each worker gets 1/N of the provider's rate limits.
    workers: Any = 1
    # Where the workers run: local (processes of this machine) or ray (Ray tasks of a cluster; nothing shared:
    # inputs are shipped and tasks sent back through Ray's object store; flowllm/experiment/ray_executor.py).
    executor: Executor = Executor.local
    # ray.init's address for executor=ray: null (a local instance, or $RAY_ADDRESS), auto, ray://host:10001.
    ray_address: str | None = None
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    # I/N: run only shard I (from 0) of N of the selected tasks, chosen by a hash of each task id
    # (flowllm/datasets/shards.py); `flowllm merge` puts the shards' folders together into one run.
    shard: str | None = None
    # redis://host:port/db[?run=NAME]: the provider's rate limits (requests, tokens, a 429's pause) and the budget's
    # spend kept in Redis, so processes on several machines (shards) hold them together (flowllm/core/coordination.py)
    coordination: str | None = None
    # s3://bucket/prefix (any fsspec URL; pip install 'flowllm[s3]'): the run folder is also kept there, each file
    # put once finished, and readers take the URL as a run (flowllm/rundir/store.py). null / file://: local only.
    store: str | None = None
    # Set by the parent of a run with workers > 1 for each worker it starts (its shard file); not for users.
    worker_shard: str | None = None


class SnapshotMode(Choice):
    """Which nodes' inputs and outputs the recorder keeps (flowllm/engine/recorder.py)."""

    all = "all"
    errors = "errors"  # only the nodes of a failed turn
    none = "none"


@dataclass
class RecorderConfig:
    snapshot: SnapshotMode = SnapshotMode.all


class ReplayTools(Choice):
    """Under provider=replay, where the tools that touch the world get their results."""

    saved = "saved"  # the replayed run's search and browse results (web_cache/, flowllm/tools/web/cache.py)
    live = "live"  # fetched again


@dataclass
class ReplayToolsConfig:
    tools: ReplayTools = ReplayTools.saved  # local tools always rerun


@dataclass
class PreflightConfig:
    """Checks before the first task (flowllm/setup/preflight.py): every problem listed at once, exit 2."""

    providers: bool = True  # each real provider (and fallback) answers a models listing; emulators are skipped
    tools: bool = True  # each tool server starts and lists its tools
    timeout_s: float = 15.0  # per provider check


@dataclass
class StatsConfig:
    """The uncertainty of every accuracy in summary.json's ``stats`` (flowllm/scoring/stats.py)."""

    interval: IntervalMethod = IntervalMethod.wilson  # wilson (binary, unclustered; else clt) | clt | bootstrap
    cluster_by: str | None = None  # a dataset field: clustered standard errors over its values
    resamples: int = 2000  # bootstrap resamples
    seed: int = 0  # the bootstrap's seed: the same run gives the same interval


@dataclass
class SweepStatsConfig:
    # The job every other job of a sweep is compared with: its number, or one of its overrides (model=x).
    baseline: str | None = None


@dataclass
class TelemetryConfig:
    """OpenTelemetry spans sent while the run runs (flowllm/telemetry/live.py); null: none."""

    otlp_endpoint: str | None = None  # an OTLP/HTTP receiver, e.g. http://127.0.0.1:6006 (/v1/traces is added)


@dataclass
class FlowConfig:
    provider: ProviderConfig = MISSING
    pipeline: PipelineConfig = MISSING
    runner: RunnerConfig = MISSING
    repair: RepairConfig = MISSING
    tools: ToolsConfig = MISSING
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    recorder: RecorderConfig = field(default_factory=RecorderConfig)
    subagents: dict[str, SubAgentConfig] = field(default_factory=dict)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    replay: ReplayToolsConfig = field(default_factory=ReplayToolsConfig)
    progress: bool = True
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    sweep: SweepStatsConfig = field(default_factory=SweepStatsConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)


SCHEMAS: dict[str, type] = {
    "provider": ProviderConfig,
    "pipeline": PipelineConfig,
    "runner": RunnerConfig,
    "repair": RepairConfig,
    "tools": ToolsConfig,
}
# The `experiment` group is different: its files are `# @package _global_` bundles that override several
# groups at once (`+experiment=gaia`), so they extend no schema of their own.


def register_configs(cs: ConfigStore | None = None) -> None:
    """Register the root schema and one ``base_<group>`` schema per group for the YAML files to extend."""
    cs = cs or ConfigStore.instance()
    # ${flowllm_search_env:<backend>} (conf/tools/web.yaml): the search backend's key variable.
    from flowllm.config.search_keys import register_resolvers

    register_resolvers()
    cs.store(name="base_config", node=FlowConfig)
    for group, schema in SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=schema)
