"""Progress of a run on the terminal: tasks done, accuracy so far, tokens, failures (rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from flowllm.experiment.runner import TaskOutcome


class ProgressReporter:
    """A rich progress bar fed by the experiment; silent when disabled or not on a terminal."""

    def __init__(self, console: Console | None = None, enabled: bool = True) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self._progress: Progress | None = None
        self._bar: Any = None
        self.done = 0
        self.correct = 0
        self.failed = 0
        self.tokens = 0

    def _fields(self) -> dict[str, Any]:
        accuracy = f"{self.correct / self.done:.1%}" if self.done else "-"
        return {"accuracy": accuracy, "tokens": f"{self.tokens:,}", "failed": self.failed}

    def start(self, total: int, already: list[TaskOutcome]) -> None:
        for outcome in already:
            self._count(outcome)
        if not self.enabled:
            return
        self._progress = Progress(
            TextColumn("[bold]tasks"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("acc {task.fields[accuracy]}"),
            TextColumn("tokens {task.fields[tokens]}"),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._bar = self._progress.add_task("tasks", total=total, completed=len(already), **self._fields())

    def _count(self, outcome: TaskOutcome) -> None:
        self.done += 1
        self.correct += int(outcome.correct)
        self.failed += int(outcome.status != "completed")
        self.tokens += outcome.usage.total_tokens

    def task_started(self, task_id: str) -> None:  # hook for richer displays; the bar shows counts only
        return None

    def task_done(self, outcome: TaskOutcome) -> None:
        self._count(outcome)
        if self._progress is not None:
            self._progress.update(self._bar, advance=1, **self._fields())

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
