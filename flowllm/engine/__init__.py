"""The engine: nodes, the turn graph, three runners and the recorder."""

from flowllm.engine.context import FanOut, ItemTimeout, TurnContext
from flowllm.engine.errors import (
    CycleError,
    DuplicateProducerError,
    FlowError,
    MissingInputError,
    NodeContractError,
    NodeExecutionError,
    PipelineError,
    UnknownTargetError,
)
from flowllm.engine.node import BoundNode, Node, node_ports
from flowllm.engine.pipeline import Pipeline, build_pipeline
from flowllm.engine.recorder import Recorder
from flowllm.engine.runners import (
    RUNNERS,
    GraphParallelRunner,
    GraphRunner,
    LegacyRunner,
    Runner,
    make_runner,
)

__all__ = [
    "RUNNERS",
    "BoundNode",
    "CycleError",
    "DuplicateProducerError",
    "FanOut",
    "FlowError",
    "GraphParallelRunner",
    "GraphRunner",
    "ItemTimeout",
    "LegacyRunner",
    "MissingInputError",
    "Node",
    "NodeContractError",
    "NodeExecutionError",
    "Pipeline",
    "PipelineError",
    "Recorder",
    "Runner",
    "TurnContext",
    "UnknownTargetError",
    "build_pipeline",
    "make_runner",
    "node_ports",
]
