"""Looking at saved runs: ``python -m flowllm.inspect RUN_DIR [command]``, ``diff``, and the HTML ``report``.

``artifacts`` reads whole runs (tasks, results, summaries) on top of ``flowllm.rundir``; the terminal views
(rich) and the report live in their own modules.
"""

from flowllm.inspect.artifacts import (
    Artifact,
    NodeRecord,
    NotARunError,
    RunRecord,
    TaskRecord,
    TurnRecord,
    open_run,
    read_artifact,
)
from flowllm.rundir.jsondiff import Difference, first_difference

__all__ = [
    "Artifact",
    "Difference",
    "NodeRecord",
    "NotARunError",
    "RunRecord",
    "TaskRecord",
    "TurnRecord",
    "first_difference",
    "open_run",
    "read_artifact",
]
