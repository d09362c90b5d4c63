"""The statistics block of ``inspect diff``: two runs paired task by task on the tasks both scored.

The difference of mean scores (B - A) with its paired standard error and 95% t interval, McNemar's exact test
when every score is 0 or 1 (a paired t-test otherwise: epochs reduced by ``mean`` give fractions), the tasks
fixed / broken / unchanged, a verdict in words and, when the difference is not significant, how many paired
tasks would detect it at 80% power (flowllm/scoring/stats.py).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from flowllm.errors import CliError
from flowllm.inspect.artifacts import RunRecord
from flowllm.run.stats import score_map
from flowllm.scoring.stats import PairedComparison, compare_paired

__all__ = ["NoCommonTasks", "paired_block", "render_paired", "run_scores"]


class NoCommonTasks(CliError):
    """The two runs have no scored task in common: nothing can be paired."""


def run_scores(run: RunRecord) -> dict[str, float]:
    """task id -> score of the run's scored tasks (epochs reduced as the run reduced them)."""
    return score_map(t.result_record for t in run.tasks if t.result_record is not None)


def paired_block(a: RunRecord, b: RunRecord) -> tuple[PairedComparison, dict[str, Any]]:
    """The comparison and its JSON form; raises ``NoCommonTasks`` when no task was scored in both runs."""
    sa, sb = run_scores(a), run_scores(b)
    ids_a = {t.task_id for t in a.tasks}
    ids_b = {t.task_id for t in b.tasks}
    if not ids_a & ids_b:
        raise NoCommonTasks(f"the runs have no task in common ({len(ids_a)} tasks in A, {len(ids_b)} in B)")
    result = compare_paired(sa, sb)  # no task scored in both: n = 0, and the verdict says so
    data = result.to_dict()
    data["only_scored_in_a"] = len(set(sa) - set(sb))
    data["only_scored_in_b"] = len(set(sb) - set(sa))
    return result, data


def render_paired(console: Console, result: PairedComparison, data: dict[str, Any]) -> None:
    table = Table(title="paired comparison (B - A, tasks scored in both)", title_justify="left", show_header=False)
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("", overflow="fold")

    def pct(value: float | None) -> str:
        return "not known" if value is None else f"{100 * value:.1f}%"

    table.add_row("tasks paired", str(result.n))
    table.add_row("A / B", f"{pct(result.mean_a)} / {pct(result.mean_b)}")
    diff = "not known" if result.diff is None else f"{100 * result.diff:+.1f} points"
    se = "not known" if result.stderr is None else f"{100 * result.stderr:.1f}"
    table.add_row("difference ± SE", f"{diff} ± {se}")
    ci = data.get("ci95")
    table.add_row("95% CI", "not known" if ci is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}] points")
    table.add_row("test", f"{result.test}, p = {'not known' if result.p_value is None else f'{result.p_value:.4g}'}")
    table.add_row("fixed / broken / unchanged", f"{result.fixed} / {result.broken} / {result.unchanged}")
    if data.get("only_scored_in_a") or data.get("only_scored_in_b"):
        table.add_row(
            "left out", f"scored in A only: {data['only_scored_in_a']}, in B only: {data['only_scored_in_b']}"
        )
    table.add_row("verdict", result.verdict())
    console.print(table)
