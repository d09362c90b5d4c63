"""``flowllm inspect export RUN --format inspect|otlp|gaia-submission``: a saved run in another tool's format.

    export RUN --format inspect -o run.eval               an Inspect AI eval log (inspect view, read_eval_log)
    export RUN --format otlp --endpoint URL              OpenTelemetry spans to an OTLP/HTTP receiver
    export RUN --format gaia-submission -o answers.jsonl  GAIA's leaderboard submission file

A file is written whole or not at all. Exit status: 0 done, 2 bad usage, not a run, a missing optional package
or an unreachable endpoint (one line on stderr). A run that is still running is exported with its finished
tasks, and the console says so.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from flowllm.export.source import ExportError, RunSource, open_source

PROG = "python -m flowllm.inspect export"
MAX_LISTED = 20  # tasks named on the console before "and N more"


class ExportFormat(StrEnum):
    inspect = "inspect"
    otlp = "otlp"
    gaia_submission = "gaia-submission"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Write a saved run in another tool's format.")
    parser.add_argument("run", help="a run directory")
    parser.add_argument("--format", required=True, choices=[f.value for f in ExportFormat])
    parser.add_argument("-o", "--output", help="the file to write (inspect: .eval; gaia-submission: .jsonl)")
    parser.add_argument("--endpoint", help="otlp: the receiver, e.g. http://127.0.0.1:6006 (/v1/traces is added)")
    return parser


def _listed(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:MAX_LISTED])
    return shown + (f" and {len(ids) - MAX_LISTED} more" if len(ids) > MAX_LISTED else "")


def _export_inspect(source: RunSource, output: Path, console: Console) -> None:
    from flowllm.export.inspect_log import write_eval_log

    count = write_eval_log(source, output)
    console.print(
        f"Inspect AI log written: [bold]{escape(str(output))}[/bold] ({count} sample(s)); view it with "
        f"`inspect view --log-dir {escape(str(output.parent))}`"
    )


def _export_gaia(source: RunSource, output: Path, console: Console) -> None:
    from flowllm.export.gaia import build_submission, write_submission

    submission = build_submission(source)
    for note in submission.notes:
        console.print(f"[yellow]{escape(note)}[/yellow]")
    write_submission(submission, output)
    console.print(
        f"GAIA submission written: [bold]{escape(str(output))}[/bold] ({len(submission.lines)} task(s) of "
        f"{escape(submission.split)})"
    )
    if submission.missing:
        console.print(
            f"[yellow]{len(submission.missing)} task(s) have no answer (an empty model_answer): "
            f"{escape(_listed(submission.missing))}[/yellow]"
        )


def _export_otlp(source: RunSource, endpoint: str, console: Console) -> None:
    from flowllm.telemetry.exporter import EndpointError, TelemetryUnavailable, open_pipeline
    from flowllm.telemetry.spans import SpanBuilder

    try:
        pipeline = open_pipeline(endpoint)
    except (EndpointError, TelemetryUnavailable) as exc:
        raise ExportError(str(exc)) from None
    builder = SpanBuilder(pipeline.tracer, str(source.path))
    made = sum(builder.task(trace) for trace in source.finished)
    pipeline.flush()
    pipeline.close()
    if pipeline.status.failure is not None:
        raise ExportError(f"{pipeline.status.failure}: {pipeline.status.sent} of {made} span(s) were received")
    console.print(
        f"sent {pipeline.status.sent} span(s) of {len(source.finished)} {source.unit} "
        f"to [bold]{escape(pipeline.url)}[/bold]"
    )


def run_export(argv: Sequence[str], console: Console) -> int:
    """The ``export`` subcommand; raises ``ExportError`` for what the caller reports as exit status 2."""
    ns = _parser().parse_args(list(argv))
    fmt = ExportFormat(ns.format)
    if fmt is ExportFormat.otlp and not ns.endpoint:
        raise ExportError("--format otlp needs --endpoint URL (an OTLP/HTTP receiver)")
    if fmt is not ExportFormat.otlp and not ns.output:
        raise ExportError(f"--format {fmt.value} needs -o FILE")
    if fmt is ExportFormat.inspect:
        from flowllm.export.inspect_log import require_inspect

        require_inspect()  # before reading the run: the missing package is the one thing to say
    source = open_source(ns.run)
    for note in source.notes:
        console.print(f"[yellow]{escape(note)}[/yellow]")
    if fmt is ExportFormat.inspect:
        _export_inspect(source, Path(ns.output), console)
    elif fmt is ExportFormat.gaia_submission:
        _export_gaia(source, Path(ns.output), console)
    else:
        _export_otlp(source, str(ns.endpoint), console)
    return 0
