"""``python -m flowllm.inspect bisect A B [--out DIR] [--sample N] [--seed S] [--max-cost USD] [--dry-run] [--json]``:
the difference in accuracy between two runs attributed to each setting that differs (flowllm/analysis/bisect_run.py):
one fork of A per setting, on the tasks whose result differs and a seeded sample of the others, live only from
each task's first differing turn. A and B are run folders (a sweep's jobs: ``SWEEP/0 SWEEP/3``) or bundles of
one run (flowllm/analysis/bisect_inputs.py)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from flowllm.analysis.bisect_inputs import bisect_input
from flowllm.analysis.bisect_run import BisectOptions, BisectReport, bisect
from flowllm.core.scratch import scratch as scratch_folder
from flowllm.inspect.commands.common import PROG
from flowllm.inspect.commands.render import emit_json, esc
from flowllm.run.report import format_usd

__all__ = ["main"]


def _points(value: float | None) -> str:
    return "not known" if value is None else f"{100 * value:+.1f}"


def _usd(value: float | None) -> str:
    return "not known" if value is None else format_usd(value)


def render(console: Console, report: BisectReport) -> None:
    plan = report.plan
    console.print(
        f"A: [bold]{esc(report.a)}[/bold]\nB: [bold]{esc(report.b)}[/bold]\n"
        f"{len(plan.common)} common tasks; forked on {len(plan.differing)} whose result differs and "
        f"{len(plan.sampled)} of the other {plan.others} (seeded sample); projected {_usd(report.projected_cost_usd)}"
    )
    for side, ids in report.tasks_only_in.items():
        console.print(f"[yellow]only in {side.upper()} (left out):[/yellow] {esc(', '.join(ids))}")
    if report.left_out_settings:
        console.print(f"[yellow]not changed by a fork (left out):[/yellow] {esc(', '.join(report.left_out_settings))}")
    if not report.effects:
        console.print("nothing forked" + ("" if report.changes else ": no setting a fork can change differs"))
        return
    table = Table(title="effect on accuracy (fork of A - A), points", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("setting", "override", "effect", "interval", "p (Holm)", "fixed / broken", "tasks"):
        table.add_column(name, justify="left" if name in ("setting", "override") else "right")
    for e in report.effects:
        ci = "not known" if e.ci is None else f"[{100 * e.ci[0]:+.1f}, {100 * e.ci[1]:+.1f}]"
        p = "not known" if e.p_holm is None else f"{e.p_holm:.3g}"
        table.add_row(
            esc(e.change.name),
            esc(" ".join(e.change.overrides)),
            _points(e.effect),
            ci,
            p,
            f"{e.flipped['fixed']} / {e.flipped['broken']}",
            str(e.tasks),
        )
    console.print(table)
    console.print(
        f"observed B - A: {_points(report.observed)} points = effects {_points(report.observed - report.interaction)}"
        f" + interaction {_points(report.interaction)}; intervals at the Bonferroni level (1 - 0.05/"
        f"{len(report.effects)}), p values Holm-adjusted"
    )
    console.print(f"spent: {_usd(report.spent.get('live_cost_usd'))} on {report.spent.get('live_calls', 0)} live calls")


def main(argv: Sequence[str], console: Console) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} bisect", description="Attribute a difference to settings.")
    parser.add_argument("run_a", help="a run folder (a sweep's job) or a bundle of one run")
    parser.add_argument("run_b", help="a run folder (a sweep's job) or a bundle of one run")
    parser.add_argument("--out", type=Path, default=None, help="where the forks go (default: A.bisect-B beside A)")
    parser.add_argument("--sample", type=int, default=5, help="tasks sampled among those whose result is the same")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-cost", type=float, default=None, help="refuse when the projection is over (USD)")
    parser.add_argument("--dry-run", action="store_true", help="plan and project only")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(list(argv))
    a, b = Path(ns.run_a).expanduser().resolve(), Path(ns.run_b).expanduser().resolve()
    out = ns.out.resolve() if ns.out is not None else a.parent / f"{a.name}.bisect-{b.name}"
    with scratch_folder("flowllm-bisect-") as scratch:
        run_a, run_b = (bisect_input(given, scratch / side) for given, side in ((a, "a"), (b, "b")))
        options = BisectOptions(out, ns.sample, ns.seed, ns.max_cost, ns.dry_run, shown=(str(a), str(b)))
        report = bisect(run_a, run_b, options)
    if ns.json:
        emit_json(report.to_dict())
    else:
        render(console, report)
    return 0
