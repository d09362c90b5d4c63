"""``python -m flowllm.inspect report``: one self-contained HTML file for a run or a multirun.

No server, no CDN, no external file: the data is embedded as JSON in the page and rendered by inline
JavaScript, so the report can be mailed, attached to a CI job or opened from a laptop years later.

Size matters more than it seems: every node's input repeats the conversation so far, so the same long strings
(system prompt, earlier replies, tool results) appear dozens of times per task. Strings of
``INTERN_MIN_CHARS`` or more are stored once in a table and referenced; strings longer than ``max_chars`` are
cut, with a note saying how much. Nodes' inputs and outputs are only turned into DOM when expanded.

Images the run stored in ``blobs/`` are embedded once per report as ``data:`` URIs (``media``, keyed by the
blob's path) and shown where a node's input or output references them; an image over ``MAX_EMBED_BYTES`` is
named in a line instead.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from flowllm.analysis.bisect_run import bisect_rows
from flowllm.analysis.scale_report import scale_rows
from flowllm.export.contamination import contamination_rows
from flowllm.inspect.artifacts import (
    Artifact,
    NodeRecord,
    NotARunError,
    RunRecord,
    TaskRecord,
    TurnRecord,
    is_run_dir,
    multirun_jobs,
    open_run,
    summary_figures,
    task_summary,
)
from flowllm.inspect.replay import is_replay, replay_counts, replay_detail, replay_label, replay_verdict
from flowllm.inspect.views import (
    NodeView,
    TurnView,
    blob_ref,
    breakdown_rows,
    media_label,
    result_row,
    run_spend,
    task_failures,
    task_turn_views,
    unavailable_tools,
)
from flowllm.rundir.results import StatsBlock
from flowllm.scoring.stats import format_estimate
from flowllm.spend.run_cache import run_cache
from flowllm.spend.task_usage import TaskBill, read_bills
from flowllm.verify import verification

INTERN_MIN_CHARS = 64
REF_KEY = "\u00a7s"  # {"§s": n} stands for strings[n]; a key no artifact uses
ERROR_KEY = "\u00a7error"
MAX_EMBED_BYTES = 2 * 1024 * 1024  # a larger image is named, not embedded (the report stays mailable)


class _Strings:
    """Interns long strings and cuts very long ones; notes the blobs (images...) the packed values point to."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.table: list[str] = []
        self._index: dict[str, int] = {}
        self.run_dir: Path | None = None  # the run whose values are being packed (blob paths are relative to it)
        self.media: dict[str, dict[str, Any]] = {}  # blob path -> {label, src (a data: URI) or None, note}

    def _note_blob(self, block: dict[str, Any], blob: str) -> None:
        if blob in self.media or self.run_dir is None:
            return
        entry: dict[str, Any] = {"label": media_label(block), "src": None, "note": None}
        media_type = str(block.get("media_type") or "")
        if block.get("type") == "image" and media_type.startswith("image/"):
            path = self.run_dir / blob
            try:
                size = path.stat().st_size
                if size > MAX_EMBED_BYTES:
                    entry["note"] = "too large to embed"
                else:
                    entry["src"] = f"data:{media_type};base64," + base64.b64encode(path.read_bytes()).decode()
            except OSError:
                entry["note"] = "file missing"
        if entry["note"]:
            entry["label"] = str(entry["label"])[:-1] + f", {entry['note']}]"
        self.media[blob] = entry

    def pack(self, value: Any) -> Any:
        if isinstance(value, str):
            if len(value) > self.max_chars:
                cut = len(value) - self.max_chars
                value = value[: self.max_chars] + f"\n... [{cut} more characters cut from the report]"
            if len(value) < INTERN_MIN_CHARS:
                return value
            index = self._index.get(value)
            if index is None:
                index = self._index[value] = len(self.table)
                self.table.append(value)
            return {REF_KEY: index}
        if isinstance(value, dict):
            blob = blob_ref(value)
            if blob is not None:
                self._note_blob(value, blob)
            return {str(k): self.pack(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.pack(v) for v in value]
        return value

    def artifact(self, artifact: Artifact) -> Any:
        if artifact.ok:
            return self.pack(artifact.value)
        return {ERROR_KEY: artifact.error}


def _node_data(node: NodeRecord, nv: NodeView, strings: _Strings) -> dict[str, Any]:
    return {
        "folder": nv.folder,
        "name": nv.name,
        "status": nv.status,
        "duration_s": nv.duration_s,
        "started_at": nv.started_at,
        "error": nv.error,
        "traceback": strings.pack(node.traceback) if node.traceback else None,
        "input": strings.artifact(node.input()),
        "output": strings.artifact(node.output()),
    }


def _turn_data(record: TurnRecord, view: TurnView, strings: _Strings) -> dict[str, Any]:
    nodes = [_node_data(node, nv, strings) for node, nv in zip(record.nodes, view.nodes, strict=True)]
    return {
        "agent": view.agent,
        "number": view.number,
        "duration_s": view.duration_s,
        "text": strings.pack(view.text),
        "stop_reason": view.stop_reason,
        "usage": view.usage,
        "calls": [{**strings.pack(c.__dict__), "label": c.label} for c in view.calls],
        "bad_calls": [strings.pack(b.__dict__) for b in view.bad_calls],
        "problems": view.problems,
        "nodes": nodes,
    }


def _task_data(
    run: RunRecord,
    task: TaskRecord,
    bills: dict[str, TaskBill],
    replayed: bool,
    strings: _Strings,
    caches: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One task's row of the page: its result, bill, failures, replay verdict and turns."""
    views = task_turn_views(task)
    turns_by_key = {(agent, t.number): t for agent, t in task.all_turns()}
    turns = [_turn_data(turns_by_key[(view.agent, view.number)], view, strings) for view in views]
    row = result_row(task).to_dict()
    bill = bills.get(task.task_id)
    # What the task was billed (the ledger's every call, failed tasks included), not only its answer's usage.
    row["billed_tokens"] = bill.total_tokens if bill else None
    row["cost_usd"] = None if bill is None or bill.cost_usd is None else round(bill.cost_usd, 6)
    row["tokens_estimated"] = bool(bill and bill.estimated)
    cache = (caches or {}).get(task.task_id, {})  # spend/run_cache.py: hit rate, input against the bound
    row["cache_hit_rate"] = cache.get("hit_rate")
    row["cache_over_bound"] = cache.get("over_bound")
    row["failures"] = [f.__dict__ for f in task_failures(task, views)]
    if replayed:  # the replay verdict, and where it diverged what the saved and the new run produced
        verdict = replay_verdict(task)
        row["replay"] = verdict
        row["replay_label"] = replay_label(verdict)
        detail = replay_detail(run, task)
        row["replay_detail"] = strings.pack(detail.to_dict()) if detail and detail.status != "exact" else None
    row["turn_records"] = turns
    return row  # the row's own fields are short; only the turns are interned


def run_data(run: RunRecord, strings: _Strings, label: str | None = None) -> dict[str, Any]:
    """Everything the page shows about one run, as JSON-able data."""
    bills = read_bills(run.path)
    spend = run_spend(run)  # the same figures as `inspect RUN` and `inspect diff` (source: where they come from)
    replayed = is_replay(run)
    strings.run_dir = run.path
    cache = run_cache(run.path).to_dict()
    caches = {row["task_id"]: row for row in cache["tasks"]}
    tasks = [_task_data(run, task, bills, replayed, strings, caches) for task in run.tasks]
    summary = task_summary(run)
    figures = summary_figures(run)
    stats = figures.stats if isinstance(figures.stats, StatsBlock) else None
    # The page shows it as written: "62.4% ± 3.8 [55.0, 69.8] n=120" (flowllm/scoring/stats.py).
    summary["accuracy_interval"] = format_estimate(stats.accuracy) if stats else None
    return {
        "label": label or run.label,
        "path": str(run.path),
        "overrides": run.overrides,
        "settings": run.main_settings(),
        "summary": summary,
        # Shown only when there is something to say: servers not offered (or "not known"), per-category accuracy.
        "tools_unavailable": unavailable_tools(figures),
        "breakdown": breakdown_rows(figures),
        "contamination": contamination_rows(figures),  # [label, text] rows (flowllm/export/contamination.py)
        "replay": replay_counts(run),
        "spend": spend,
        "cache": cache["total"],  # the prompt cache's hit rate and the input billed against the bound
        "problems": run.problems,
        "verification": verification(run.path).to_dict(),  # flowllm verify's verdict on the run
        "scale": scale_rows(run.path),  # epochs > 1: majority@k, pass@k, pass^k, mean@k per k
        "tasks": tasks,
    }


def build_report_data(path: Path, max_chars: int = 20000) -> dict[str, Any]:
    """The page's data for a run directory or a multirun directory (raises ``NotARunError`` otherwise)."""
    strings = _Strings(max_chars)
    path = Path(path).expanduser()
    if is_run_dir(path) or not multirun_jobs(path):
        run = open_run(path)  # raises NotARunError with the reason when it is neither
        data = [run_data(run, strings)]
        return {"kind": "run", "title": str(path), "runs": data, "strings": strings.table, "media": strings.media}
    runs: list[dict[str, Any]] = []
    problems: list[str] = []
    for job in multirun_jobs(path):
        try:
            runs.append(run_data(open_run(job), strings, label=job.name))
        except NotARunError as exc:  # one broken job must not hide the others
            problems.append(str(exc))
    return {
        "kind": "multirun",
        "title": str(path),
        "runs": runs,
        "problems": problems,
        "bisect": bisect_rows(path),  # a bisect's folder (its forks are the jobs): each setting's effect
        "strings": strings.table,
        "media": strings.media,  # keyed by content hash: a blob two jobs share is embedded once
    }


def _embed(data: dict[str, Any]) -> str:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    # Inside <script>, "</" could close the tag and "<!--" open a comment: escape both (still valid JSON).
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


@cache
def _template() -> str:
    """The page (its CSS and JavaScript inline), shipped as package data: ``flowllm/inspect/templates``."""
    return files("flowllm.inspect").joinpath("templates", "report.html").read_text(encoding="utf-8")


def render_html(data: dict[str, Any]) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    title = f"flowllm report: {data['title']}"
    page = _template().replace("%%TITLE%%", _escape(title)).replace("%%GENERATED%%", stamp)
    return page.replace("%%DATA%%", _embed(data))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def write_report(path: Path, output: Path | None = None, max_chars: int = 20000) -> tuple[Path, dict[str, Any]]:
    """Write the report; returns its path and a few figures (bytes, runs, tasks)."""
    data = build_report_data(path, max_chars=max_chars)
    target = output or (Path(path).expanduser() / "report.html")
    html = render_html(data)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(html, encoding="utf-8")
    info = {
        "bytes": len(html.encode("utf-8")),
        "runs": len(data["runs"]),
        "tasks": sum(len(r["tasks"]) for r in data["runs"]),
        "kind": data["kind"],
    }
    return target, info
