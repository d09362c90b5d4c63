"""What ``prepare()`` builds from a composed config before anything starts: one typed record of the run's parts.

The app checks every setting once, where it reads it, and hands this record to the experiment, the workers and
the summary; nobody downstream reads the parts back out of the raw Hydra config.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowllm.agent.results import AgentSettings
from flowllm.agent.subagents import SubAgentSpec
from flowllm.config.provider_schema import ProviderConfig
from flowllm.config.schema import JudgeConfig
from flowllm.datasets.task import Task
from flowllm.engine.pipeline import Pipeline
from flowllm.engine.runners import Runner
from flowllm.providers.registry import ProviderTable
from flowllm.run.runner import ExperimentSettings
from flowllm.setup.vision import VisionPlan
from flowllm.spend.pricing import PriceTable
from flowllm.tools.client.pool import ToolCatalog
from flowllm.tools.client.settings import PoolSettings


@dataclass
class PreparedRun:
    """A validated run: the turn graph and its runner, the provider, the tasks, prices, sub-agents and judge, the
    tool settings and the experiment's (its spending caps among them)."""

    pipeline: Pipeline
    runner: Runner
    provider_cfg: ProviderConfig
    tasks: list[Task]
    settings: AgentSettings
    prices: PriceTable
    subagents: dict[str, SubAgentSpec]
    judge_cfg: JudgeConfig
    judge_provider: ProviderConfig | None  # set when the dataset is scored by an LLM judge
    # Every provider config the run names by name (fallbacks, aliases, agent models, judge, vision, a fork's live
    # provider), read once here: the providers resolve names from this table, never from config files.
    providers: ProviderTable
    tools: PoolSettings  # the tool servers, loaded and checked once (web_tools adds the run's environment)
    experiment: ExperimentSettings  # concurrency, attempts, epochs, limits and budget
    # Every tool server's listing, from the preflight that started each once (None: the pool discovers them).
    tools_catalog: ToolCatalog | None = None
    # tool-vision (tools.vision.enabled): its provider and settings; None when the tool is off.
    vision: VisionPlan | None = None
