"""A run's steering, wired for the run's one process and for the parent of its workers: the control desk that
answers ``flowllm ctl`` (flowllm/run/ctl_desk.py), what each process follows (flowllm/run/control.py), and the
adaptive calls in flight of ``experiment.max_concurrent=auto`` (flowllm/providers/adaptive/aimd.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from flowllm.datasets.task import Task
from flowllm.providers.adaptive.aimd import AdaptiveConcurrency, AdaptiveSettings, SharedText
from flowllm.run.control import POLL_S
from flowllm.run.ctl_desk import ControlDesk
from flowllm.run.outcome import FAILED, read_outcome
from flowllm.run.runner import ExperimentSettings
from flowllm.rundir.layout import RunLayout

log = logging.getLogger(__name__)


def adaptive_limits(
    settings: ExperimentSettings,
    *,
    workers: int = 1,
    shared_dir: Path | None = None,
    shared_value: Callable[[str], SharedText] | None = None,
) -> AdaptiveConcurrency | None:
    """The run's adaptive limits of calls in flight (None unless ``experiment.max_concurrent=auto``); with
    ``shared_value`` (experiment.coordination) one limit for the run's processes on every machine."""
    if settings.adaptive_ceiling is None:
        return None
    return AdaptiveConcurrency(
        AdaptiveSettings(settings.adaptive_ceiling, workers=workers, shared_dir=shared_dir, shared_value=shared_value)
    )


def concurrency_text(
    settings: ExperimentSettings, adaptive: AdaptiveConcurrency | None, desk: ControlDesk
) -> Callable[[], str | None]:
    """What the progress line shows of the run's limit: the adaptive limit, or a max_concurrent set by ctl."""

    def text() -> str | None:
        if adaptive is not None:
            return adaptive.describe()
        changed = desk.state.max_concurrent
        return str(changed) if changed is not None and changed != settings.max_concurrent else None

    return text


def requeue_check(run_dir: Path, tasks: list[Task]) -> Callable[[str], str | None]:
    """Why a task cannot be requeued (None: it can): it must be the run's, and failed."""
    by_id, layout = {t.task_id: t for t in tasks}, RunLayout(run_dir)

    def why(task_id: str) -> str | None:
        task = by_id.get(task_id)
        if task is None:
            return "it is not a task of this run"
        outcome = read_outcome(layout.result(task_id), task, None)
        if outcome is None:
            return "it has not finished (only a failed task can be requeued)"
        if outcome.status != FAILED:
            return f"its status is {outcome.status} (only a failed task can be requeued)"
        return None

    return why


@contextlib.asynccontextmanager
async def steering(desk: ControlDesk) -> AsyncIterator[ControlDesk]:
    """The desk open and answering (every POLL_S, off the event loop) while the run runs."""
    try:
        desk.open()
    except OSError as exc:  # the run goes on without a control channel
        log.warning("flowllm: no control channel (flowllm ctl) for this run: %s", exc)
        yield desk
        return

    async def answer() -> None:
        while True:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(desk.poll)
            await asyncio.sleep(POLL_S)

    poller = asyncio.create_task(answer())
    try:
        yield desk
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        desk.close()
