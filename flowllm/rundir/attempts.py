"""Which attempt of its task the running code belongs to (pass@k, ``experiment.attempts`` > 1).

While attempt n of a task runs, this context variable holds n, inherited by every coroutine the attempt starts
(its turns, tool calls, sub-agents), as ``flowllm.rundir.epochs`` holds the epoch. A batched call
(``flowllm.providers.batch``) puts it in its custom id, so each attempt's calls are their own requests.
``None`` (the default): code that runs outside an experiment's attempt.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from flowllm.rundir.layout import ATTEMPTS_DIR, LEGACY_AGENTS_DIR, STATE_FILE, TURN_GLOB, WORKSPACE_DIR

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


def shelve_attempt(task_dir: Path, number: int) -> None:
    """Move attempt ``number``'s records (its turns, sub-agents, workspace and task state) from the task's folder
    to ``attempts/<number>/``, so that the next attempt starts from the task folder again."""
    target = task_dir / ATTEMPTS_DIR / str(number)
    target.mkdir(parents=True, exist_ok=True)
    kept = (LEGACY_AGENTS_DIR, WORKSPACE_DIR, STATE_FILE)
    for item in (*sorted(task_dir.glob(TURN_GLOB)), *(task_dir / name for name in kept)):
        if item.exists():
            shutil.move(str(item), str(target / item.name))
