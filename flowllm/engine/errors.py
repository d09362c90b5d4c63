"""Errors of the engine. Each message names the node and the config file, and says what to do."""

from __future__ import annotations

from flowllm.errors import BuildError, FlowError, RunError

__all__ = [
    "CycleError",
    "DuplicateProducerError",
    "FlowError",
    "MissingInputError",
    "NodeContractError",
    "NodeExecutionError",
    "PipelineError",
    "UnknownTargetError",
]


class PipelineError(BuildError):
    """The pipeline config is wrong; raised while building the graph, before any model is called."""

    def __init__(self, message: str, *, node: str | None = None, source: str | None = None) -> None:
        where = []
        if source:
            where.append(source)
        if node:
            where.append(f"node '{node}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.node = node
        self.source = source


class UnknownTargetError(PipelineError):
    pass


class MissingInputError(PipelineError):
    pass


class DuplicateProducerError(PipelineError):
    pass


class CycleError(PipelineError):
    pass


class NodeContractError(RunError):
    """A node returned something other than the outputs it declared (found while a turn runs: the task fails)."""

    def __init__(self, message: str, *, node: str | None = None) -> None:
        super().__init__(f"node '{node}': {message}" if node else message)
        self.node = node


class NodeExecutionError(RunError):
    """A node raised while running a turn; the cause is chained."""

    def __init__(self, node: str, cause: BaseException) -> None:
        super().__init__(f"node '{node}' failed: {type(cause).__name__}: {cause}")
        self.node = node
        self.cause = cause
