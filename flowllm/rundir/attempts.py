"""Which attempt of its task the running code belongs to (pass@k, ``experiment.attempts`` > 1).

While attempt n of a task runs, this context variable holds n, inherited by every coroutine the attempt starts
(its turns, tool calls, sub-agents), as ``flowllm.rundir.epochs`` holds the epoch. A batched call
(``flowllm.providers.batch``) puts it in its custom id, so each attempt's calls are their own requests.
``None`` (the default): code that runs outside an experiment's attempt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_ATTEMPT: ContextVar[int | None] = ContextVar("flowllm_attempt", default=None)


def current_attempt() -> int | None:
    return _ATTEMPT.get()


@contextlib.contextmanager
def running_attempt(attempt: int | None) -> Iterator[None]:
    """Code inside runs as attempt ``attempt`` of its task (None: not in an attempt)."""
    token = _ATTEMPT.set(attempt)
    try:
        yield
    finally:
        _ATTEMPT.reset(token)
