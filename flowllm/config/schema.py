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


@dataclass
class ThinkingConfig:
    mode: str = "disabled"  # enabled | adaptive | disabled
    budget_tokens: int = 10000


@dataclass
class CacheConfig:
    enabled: bool = True
    ttl: str = "5m"  # 5m | 1h (Anthropic)


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


@dataclass
class RepairConfig:
    name: str = MISSING
    stages: list[str] = field(default_factory=list)


@dataclass
class RunnerConfig:
    name: str = MISSING  # legacy | graph | graph_parallel
    item_timeout_s: float = 900.0  # per fan-out item (one tool call or sub-agent): a safety net
    turn_timeout_s: float = 1800.0  # all fan-out items of one node together


@dataclass
class PipelineConfig:
    name: str = MISSING
    # Node name -> node config ({_target_: ..., inputs?: {port: state_key}, outputs?: {port: state_key}, ...}).
    nodes: dict[str, Any] = MISSING


@dataclass
class ToolServerConfig:
    command: str = MISSING
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0
    blacklist: list[str] = field(default_factory=list)
    # Tools that need a key are optional: a missing variable disables the server with a warning.
    requires_env: list[str] = field(default_factory=list)


@dataclass
class ToolsConfig:
    name: str = MISSING
    servers: dict[str, ToolServerConfig] = field(default_factory=dict)
    call_timeout_s: float = 60.0
    max_result_chars: int = 20000
    scope: str = "task"  # task | run: how long a server process lives


@dataclass
class AgentConfig:
    max_turns: int = 10
    keep_tool_result: int = -1  # how many of the latest tool results trim_history keeps; -1 keeps all
    system_prompt: str = ""
    summary_prompt: str = (
        "You have reached the turn limit. Do not call any tool. Give your final answer now, "
        "wrapped in \\boxed{}."
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


@dataclass
class ExperimentConfig:
    name: str = "sample"
    max_concurrent: int = 4
    task_timeout_s: float = 900.0
    attempts: int = 1  # pass@k: up to k attempts per task, stopping at the first correct answer
    resume: bool = True  # skip tasks whose result.json says completed (rerun into the same hydra.run.dir)
    pricing: str = "conf/pricing.yaml"  # USD per million tokens, per model; relative to cwd, else the project


@dataclass
class RecorderConfig:
    snapshot: str = "all"  # all | errors | none


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
    recorder: RecorderConfig = field(default_factory=RecorderConfig)
    subagents: dict[str, SubAgentConfig] = field(default_factory=dict)
    progress: bool = True


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
    cs.store(name="base_config", node=FlowConfig)
    for group, schema in SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=schema)
