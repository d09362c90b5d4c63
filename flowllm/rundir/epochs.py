"""Which epoch of its task the running code belongs to (``experiment.epochs`` > 1).

The experiment runs a task's epochs one after another; while epoch n runs, this context variable holds n, and
every coroutine the task starts (its turns, tool calls, sub-agents) inherits it from the task's own context.
The recorder writes the epoch's records under ``tasks/<id>/epochs/<n>/`` and replay serves the same epoch of
the replayed run from there. ``None`` (the default): a run without epochs, records in the task's folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_EPOCH: ContextVar[int | None] = ContextVar("flowllm_epoch", default=None)


def current_epoch() -> int | None:
    return _EPOCH.get()


@contextlib.contextmanager
def running_epoch(epoch: int | None) -> Iterator[None]:
    """Code inside runs as epoch ``epoch`` of its task (None: not an epochs run)."""
    token = _EPOCH.set(epoch)
    try:
        yield
    finally:
        _EPOCH.reset(token)
