"""The comparison of a Hydra multirun: one row per job (overrides, accuracy, parse rate, tokens, cost, time).

Built from the job folders alone (each job's ``summary.json`` and ``.hydra/overrides.yaml``), so it can be made
at any time, also for a sweep in which a job failed or that is still running:

    python -m flowllm.sweep.summary runs/multirun/2026-12-01/10-00-00

writes into the sweep folder ``sweep_summary.json``, the table as ``sweep_summary.md``, and
``sweep_accuracy_vs_cost.png`` when matplotlib is installed (``pip install flowllm[plot]``). During a sweep the
same files are kept up to date twice over: each job refreshes them when it finishes (under a file lock, since
jobs may finish together), and ``SweepSummaryCallback`` rebuilds them and prints the table when Hydra calls
``on_multirun_end`` (which it skips when any job raised).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml  # PyYAML comes with hydra-core / omegaconf
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from flowllm.engine.recorder import atomic_write, read_json
from flowllm.errors import ConfigError
from flowllm.exit_codes import ExitCode, sweep_exit_code
from flowllm.run.report import format_usd, make_console
from flowllm.rundir.layout import (
    LOG_FILE,
    SWEEP_PLOT_FILE,
    SWEEP_SUMMARY_FILE,
    SWEEP_TABLE_FILE,
    RunLayout,
    SweepLayout,
)
from flowllm.rundir.results import RunSummary
from flowllm.scoring.stats import format_estimate
from flowllm.sweep.stats import (
    SCORED_STATUSES,
    add_comparisons,
    baseline_cell,
    compared,
    configured_baseline,
    draw_uncertainty,
    job_accuracy,
)
from flowllm.sweep.tables import print_tables

log = logging.getLogger(__name__)


@dataclass
class JobRow:
    job: str  # the job folder, relative to the sweep folder
    overrides: list[str]
    # ok | interrupted | budget (its budget ended it, tasks left) | failed (a run error stopped it) | error |
    # unfinished (no summary.json yet)
    status: str
    accuracy: float | None = None  # over the scored tasks; None: not known (nothing could be scored)
    correct: int | None = None
    scored: int | None = None  # None: a summary from before unscored tasks were counted (every task scored)
    unscored: int | None = None
    tasks: int | None = None
    unfinished: int | None = None  # tasks the job left unfinished (its budget, a Ctrl-C): not in its accuracy
    completed: int | None = None
    failed: int | None = None
    parse_rate: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cost_usd: float | None = None
    wall_seconds: float | None = None
    provider: str | None = None
    model: str | None = None
    error: str | None = None
    # Which benchmark the job ran (experiment.name) and who scored it: a sweep may span benchmarks.
    benchmark: str | None = None
    scorer: str | None = None  # gaia | exact | judge (None: a run from before scorers were recorded)
    judge_model: str | None = None
    scoring_errors: int | None = None
    label: str = ""  # the overrides that differ between the sweep's jobs
    # summary.json → stats → accuracy (flowllm/sweep/stats.py): over scored tasks, with its interval;
    # this job against the baseline job, paired; whether no other job is both cheaper and more accurate.
    stats: dict[str, Any] | None = None
    vs_baseline: dict[str, Any] | None = None
    pareto: bool = False
    budget: dict[str, Any] | None = None  # summary.json → budget: a job its budget ended makes the sweep exit 3

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SweepSummary:
    sweep_dir: Path
    jobs: list[JobRow] = field(default_factory=list)
    common_overrides: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None  # the job the others are compared with
    baseline_error: str | None = None  # sweep.baseline names no job: no comparison

    def to_dict(self) -> dict[str, Any]:
        ok = [j for j in self.jobs if j.status == "ok" and j.accuracy is not None]
        best = max(ok, key=lambda j: (j.accuracy or 0.0, -(j.cost_usd or 0.0)), default=None)
        return {
            "sweep_dir": str(self.sweep_dir),
            "jobs": [j.to_dict() for j in self.jobs],
            "common_overrides": self.common_overrides,
            "counts": {
                status: sum(1 for j in self.jobs if j.status == status)
                for status in ("ok", "interrupted", "budget", "error", "unfinished")
            },
            "best": None if best is None else {"job": best.job, "label": best.label, "accuracy": best.accuracy},
            "baseline": self.baseline,
            "baseline_error": self.baseline_error,
            "comparison": "each job against the baseline, paired on the tasks both scored; p-values Holm-corrected",
            "pareto_front": [j.job for j in self.jobs if j.pareto],
            "files": self.files,
        }


def _job_sort_key(path: Path, sweep_dir: Path) -> tuple[Any, ...]:
    # Hydra numbers jobs 0, 1, ... 10: sort numerically where the folder names are numbers.
    parts = path.relative_to(sweep_dir).parts
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)


def find_job_dirs(sweep_dir: Path, max_depth: int = 3) -> list[Path]:
    """Job folders under a sweep folder (Hydra's ``subdir`` may nest them), in job order."""
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        # A job folder is any folder with Hydra's record of the job's overrides in it.
        if RunLayout(folder).overrides.is_file() and folder != sweep_dir:
            found.append(folder)
            return
        if depth >= max_depth:
            return
        for child in folder.iterdir():
            if child.is_dir() and not child.name.startswith("."):
                walk(child, depth + 1)

    walk(sweep_dir, 0)
    return sorted(found, key=lambda p: _job_sort_key(p, sweep_dir))


def read_job(job_dir: Path, sweep_dir: Path) -> JobRow:
    name = str(job_dir.relative_to(sweep_dir))
    try:
        overrides = [str(o) for o in (yaml.safe_load(RunLayout(job_dir).overrides.read_text(encoding="utf-8")) or [])]
    except (OSError, yaml.YAMLError):
        overrides = []
    summary_path = RunLayout(job_dir).summary
    if not summary_path.is_file():
        return JobRow(name, overrides, "unfinished", error="no summary.json: the job has not finished")
    try:
        summary = RunSummary.from_dict(read_json(summary_path))
    except Exception as exc:
        return JobRow(name, overrides, "error", error=f"summary.json unreadable: {exc}")
    if summary.status == "error":
        return JobRow(name, overrides, "error", error=str(summary.error))
    usage = summary.usage
    status = "failed" if summary.status == "failed" else "interrupted" if summary.interrupted else "ok"
    if status == "ok" and summary.budget_ended_run:
        status = "budget"
    return JobRow(
        job=name,
        overrides=overrides,
        status=status,
        error=summary.error if status == "failed" else None,
        accuracy=summary.accuracy,
        correct=summary.correct,
        scored=summary.scored,
        unscored=summary.unscored,
        tasks=summary.tasks,
        unfinished=summary.unfinished,
        completed=summary.completed,
        failed=summary.failed,
        parse_rate=summary.parse_rate,
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
        cache_read_tokens=usage.get("cache_read_tokens"),
        cost_usd=summary.cost_usd,
        wall_seconds=summary.wall_seconds,
        provider=summary.provider,
        model=summary.model,
        benchmark=summary.experiment,
        scorer=summary.scorer,
        judge_model=(summary.judge or {}).get("model"),
        scoring_errors=summary.scoring_errors,
        stats=summary.stats.accuracy if summary.stats is not None else None,
        budget=summary.budget.to_dict() if summary.budget is not None else None,
    )


def label_jobs(rows: Sequence[JobRow]) -> list[str]:
    """Give each row the overrides that tell it apart; return the overrides all jobs share."""
    if not rows:
        return []
    common = set(rows[0].overrides)
    for row in rows[1:]:
        common &= set(row.overrides)
    for row in rows:
        row.label = " ".join(o for o in row.overrides if o not in common) or row.job
    return [o for o in rows[0].overrides if o in common]


def collect(sweep_dir: Path | str, *, baseline: str | None = None, strict: bool = False) -> SweepSummary:
    """The sweep's rows and their comparison with the baseline job (``baseline``, else the jobs' own
    ``sweep.baseline``); ``strict``: a baseline that names no job raises ``ConfigError`` instead of being noted."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep folder '{sweep_dir}' does not exist")
    dirs = find_job_dirs(sweep_dir)
    rows = [read_job(job, sweep_dir) for job in dirs]
    common = label_jobs(rows)
    summary = SweepSummary(sweep_dir, rows, common)
    if baseline is None:
        baseline = configured_baseline(dirs)
    add_comparisons(summary, dirs, baseline, strict=strict)
    return summary


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def table_rows(summary: SweepSummary) -> list[list[str]]:
    rows = []
    for j in summary.jobs:
        scored = j.scored if j.scored is not None else j.tasks
        accuracy = "not known" if j.accuracy is None and j.status in SCORED_STATUSES else _pct(j.accuracy)
        if j.correct is not None and scored is not None:
            accuracy += f" ({j.correct}/{scored})"
        if j.stats is not None:
            accuracy = format_estimate(j.stats)
        if j.unscored:
            accuracy += f", {j.unscored} unscored"
        if j.scoring_errors:
            accuracy += f", {j.scoring_errors} not judged"
        if j.unfinished:
            accuracy += f", {j.unfinished} unfinished, not counted"
        rows.append(
            [
                j.job,
                j.benchmark or "-",
                j.label,
                j.status if j.status not in ("error", "failed") else f"{j.status}: {(j.error or '')[:120]}",
                accuracy,
                f"judge {j.judge_model}" if j.judge_model else (j.scorer or "-"),
                _pct(j.parse_rate),
                _int(j.input_tokens),
                _int(j.output_tokens),
                format_usd(j.cost_usd),
                "-" if j.wall_seconds is None else f"{j.wall_seconds:.1f}s",
                *([baseline_cell(summary, j)] if compared(summary) else []),
            ]
        )
    return rows


COLUMNS = [
    "job",
    "benchmark",
    "overrides",
    "status",
    "accuracy",
    "scored by",
    "parse rate",
    "tokens in",
    "tokens out",
    "cost",
    "time",
]
BASELINE_COLUMN = "vs baseline (points, 95% CI, p)"


def columns(summary: SweepSummary) -> list[str]:
    return [*COLUMNS, BASELINE_COLUMN] if compared(summary) else COLUMNS


def rich_table(summary: SweepSummary) -> Table:
    title = "sweep"
    if summary.common_overrides:
        title += f" (all jobs: {' '.join(summary.common_overrides)})"
    table = Table(title=title)
    for column in columns(summary):
        table.add_column(column)
    for row in table_rows(summary):
        table.add_row(*row)
    return table


def markdown_table(summary: SweepSummary) -> str:
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = [f"# Sweep {summary.sweep_dir}", ""]
    if summary.common_overrides:
        lines += [f"All jobs: `{' '.join(summary.common_overrides)}`", ""]
    lines.append("| " + " | ".join(columns(summary)) + " |")
    lines.append("|" + "---|" * len(columns(summary)))
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in table_rows(summary)]
    return "\n".join(lines) + "\n"


def plot_accuracy_vs_cost(summary: SweepSummary, path: Path) -> Path | None:
    """A scatter of accuracy against cost, one labelled point per finished job; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on servers and workers
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    points = [j for j in summary.jobs if j.accuracy is not None and j.status in SCORED_STATUSES]
    if not points:
        return None
    priced = all(j.cost_usd is not None for j in points)
    # Unpriced models have no cost: fall back to tokens, which every job has.
    xs = [float(j.cost_usd or 0.0) if priced else float((j.input_tokens or 0) + (j.output_tokens or 0)) for j in points]
    ys = [100.0 * job_accuracy(j) for j in points]  # over scored tasks when known: where the error bars sit
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    try:
        ax.scatter(xs, ys, s=40, color="#1f77b4", zorder=3)
        draw_uncertainty(ax, xs, ys, points)
        for x, y, job in zip(xs, ys, points, strict=True):
            ax.annotate(job.label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
        ax.set_xlabel("cost (USD)" if priced else "tokens (input + output)")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-5, 105)
        span = max(xs) - min(xs)
        pad = span * 0.15 if span > 0 else max(abs(xs[0]) * 0.15, 1e-6)
        ax.set_xlim(min(xs) - pad, max(xs) + pad * 3)
        ax.grid(True, alpha=0.3, zorder=0)
        ax.set_title("accuracy against cost, one point per job")
        fig.tight_layout()
        tmp = path.with_name(f".{path.name}.tmp.png")
        fig.savefig(tmp)
        tmp.replace(path)
    finally:
        plt.close(fig)
    return path


@contextlib.contextmanager
def _locked(sweep_dir: Path) -> Iterator[None]:
    """Serialise rebuilds: jobs finishing together must not overwrite a fuller summary with an older one."""
    try:
        import fcntl
    except ImportError:  # not on POSIX: rebuilds are rare enough to race harmlessly
        yield
        return
    with open(SweepLayout(sweep_dir).lock, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_sweep_summary(
    sweep_dir: Path | str, *, plot: bool = True, baseline: str | None = None, strict: bool = False
) -> SweepSummary:
    """Collect the jobs of a sweep folder and write the summary files into it."""
    sweep_dir = Path(sweep_dir)
    with _locked(sweep_dir):
        summary = collect(sweep_dir, baseline=baseline, strict=strict)
        layout = SweepLayout(sweep_dir)
        summary.files = {"json": SWEEP_SUMMARY_FILE, "table": SWEEP_TABLE_FILE}
        if plot and plot_accuracy_vs_cost(summary, layout.plot) is not None:
            summary.files["plot"] = SWEEP_PLOT_FILE
        atomic_write(layout.table, markdown_table(summary).encode())
        atomic_write(layout.summary, _dumps(summary.to_dict()))
    return summary


def _dumps(value: Any) -> bytes:
    import orjson

    def default(obj: Any) -> Any:
        if isinstance(obj, float) and math.isnan(obj):
            return None
        return str(obj)

    return orjson.dumps(value, default=default, option=orjson.OPT_INDENT_2) + b"\n"


def print_sweep(summary: SweepSummary, console: Console | None = None) -> None:
    console = console or make_console()
    console.print(rich_table(summary))
    if summary.baseline_error:
        console.print(f"[yellow]no comparison: {summary.baseline_error}[/yellow]", markup=True)
    elif summary.baseline is not None:
        console.print(f"baseline: job {summary.baseline}; p-values Holm-corrected over the comparisons")
    for kind, name in summary.files.items():
        console.print(f"{kind}: {summary.sweep_dir / name}")


def _in_sweep(config: DictConfig) -> bool:
    return OmegaConf.select(config, "hydra.mode", default=None) == RunMode.MULTIRUN


def _job_label(config: DictConfig) -> str:
    number = OmegaConf.select(config, "hydra.job.num", default="?")
    overrides = OmegaConf.select(config, "hydra.overrides.task", default=None) or []
    shown = " ".join(str(o) for o in OmegaConf.to_container(overrides, resolve=False) or [])
    return f"{number} ({shown})" if shown else str(number)


def _job_outcome(config: DictConfig) -> str:
    """What the job's summary.json says: accuracy, failures, cost and time; or that it wrote none."""
    folder = OmegaConf.select(config, "hydra.runtime.output_dir", default=None)
    try:
        summary = RunSummary.from_dict(json.loads(RunLayout(Path(str(folder))).summary.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return f"ended without a summary (see its folder's {LOG_FILE})"
    if summary.status == "error":
        return f"error: {summary.error}"
    accuracy = summary.accuracy
    scored = summary.scored_count
    if summary.replay is not None and summary.replay.scored is not None:
        scored = summary.replay.scored
    ended = "the budget ended it" if summary.budget_ended_run else "done"
    parts = [
        "stopped" if summary.status == "failed" else "interrupted" if summary.interrupted else ended,
        f"{summary.correct or 0}/{scored} correct"
        + (f" ({accuracy:.1%})" if isinstance(accuracy, int | float) else ", accuracy not known"),
    ]
    if summary.unscored:
        parts.append(f"{summary.unscored} unscored")
    if summary.unfinished:
        parts.append(f"{summary.unfinished} unfinished")
    if summary.failed:
        parts.append(f"{summary.failed} failed")
    cost = summary.cost_usd
    parts.append(f"${cost:.4f}" if isinstance(cost, int | float) else "cost unknown")
    if isinstance(summary.wall_seconds, int | float):
        parts.append(f"{summary.wall_seconds:.1f}s")
    return ", ".join(parts)


class SweepSummaryCallback(Callback):
    """Hydra callback: at the end of a multirun, write and print the sweep's comparison."""

    def __init__(self, plot: bool = True) -> None:
        self.plot = plot

    # One line per job as it starts and as it ends, so a long sweep shows where it is (the jobs' own progress
    # bars come and go in between; under a process launcher the lines of jobs that run together interleave).
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if _in_sweep(config):
            print(f"sweep job {_job_label(config)}: running", file=sys.stderr, flush=True)

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if _in_sweep(config):
            print(f"sweep job {_job_label(config)}: {_job_outcome(config)}", file=sys.stderr, flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        try:
            summary = build_sweep_summary(sweep_dir, plot=self.plot, strict=True)
        except ConfigError as exc:  # sweep.baseline names no job: one line, exit 2 (the jobs' results are kept)
            print(f"flowllm: error: {exc}", file=sys.stderr)
            sys.exit(ExitCode.CONFIG)
        except Exception as exc:  # the jobs' own results are safe; say why the comparison is missing
            log.warning("flowllm: could not write the sweep summary in %s: %s", sweep_dir, exc)
            return
        print_tables(lambda console: print_sweep(summary, console))
        # Hydra discards the jobs' return values: the sweep's exit code is decided here, from the job rows.
        code = sweep_exit_code(job.to_dict() for job in summary.jobs)
        if code is not ExitCode.OK:
            print(f"flowllm: sweep exits {int(code)} ({code.meaning})", file=sys.stderr)
            sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flowllm.sweep.summary",
        description="Rebuild a multirun's comparison (sweep_summary.json, .md and the plot) from its job folders.",
    )
    parser.add_argument("sweep_dir", type=Path, help="the multirun folder (hydra.sweep.dir)")
    parser.add_argument("--no-plot", action="store_true", help="skip the accuracy-against-cost PNG")
    parser.add_argument("--baseline", help="the job to compare with: its number or one of its overrides")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"flowllm: error: sweep folder '{args.sweep_dir}' does not exist", file=sys.stderr)
        return 2
    try:
        summary = build_sweep_summary(args.sweep_dir, plot=not args.no_plot, baseline=args.baseline, strict=True)
    except ConfigError as exc:
        print(f"flowllm: error: {exc}", file=sys.stderr)
        return 2
    if not summary.jobs:
        print(f"flowllm: error: no job folders (with .hydra/overrides.yaml) under '{args.sweep_dir}'", file=sys.stderr)
        return 2
    print_sweep(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
