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
from pathlib import Path
from typing import Any

from flowllm.experiment.task_usage import read_bills
from flowllm.inspect.artifacts import (
    Artifact,
    NotARunError,
    RunRecord,
    is_run_dir,
    multirun_jobs,
    open_run,
    task_summary,
)
from flowllm.inspect.views import (
    blob_ref,
    breakdown_rows,
    is_replay,
    media_label,
    replay_counts,
    replay_detail,
    replay_label,
    replay_verdict,
    result_row,
    run_spend,
    task_failures,
    task_turn_views,
    unavailable_tools,
)

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


def run_data(run: RunRecord, strings: _Strings, label: str | None = None) -> dict[str, Any]:
    """Everything the page shows about one run, as JSON-able data."""
    bills = read_bills(run.path)
    spend = run_spend(run)  # the same figures as `inspect RUN` and `inspect diff` (source: where they come from)
    replayed = is_replay(run)
    strings.run_dir = run.path
    tasks = []
    for task in run.tasks:
        views = task_turn_views(task)
        turns_by_key = {(agent, t.number): t for agent, t in task.all_turns()}
        turns = []
        for view in views:
            record = turns_by_key[(view.agent, view.number)]
            nodes = []
            for node, nv in zip(record.nodes, view.nodes, strict=True):
                nodes.append(
                    {
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
                )
            turns.append(
                {
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
            )
        row = result_row(task)
        bill = bills.get(task.task_id)
        # What the task was billed (the ledger's every call, failed tasks included), not only its answer's usage.
        row["billed_tokens"] = bill.total_tokens if bill else None
        row["cost_usd"] = None if bill is None or bill.cost_usd is None else round(bill.cost_usd, 6)
        row["tokens_estimated"] = bool(bill and bill.estimated)
        row["failures"] = [f.__dict__ for f in task_failures(task, views)]
        if replayed:  # the replay verdict, and where it diverged what the saved and the new run produced
            row["replay"] = replay_verdict(task)
            row["replay_label"] = replay_label(row["replay"])
            detail = replay_detail(run, task)
            row["replay_detail"] = strings.pack(detail.to_dict()) if detail and detail.status != "exact" else None
        row["turn_records"] = turns
        tasks.append(row)  # the row's own fields are short; only the turns are interned
    summary = task_summary(run)
    return {
        "label": label or run.label,
        "path": str(run.path),
        "overrides": run.overrides,
        "settings": {
            "experiment": run.setting("experiment.name"),
            "provider": run.setting("provider.name"),
            "model": run.setting("provider.model"),
            "protocol": run.setting("provider.protocol"),
            "runner": run.setting("runner.name"),
            "repair": run.setting("repair.name"),
        },
        "summary": summary,
        # Shown only when there is something to say: servers not offered (or "not known"), per-category accuracy.
        "tools_unavailable": unavailable_tools(summary),
        "breakdown": breakdown_rows(summary),
        "replay": replay_counts(run),
        "spend": spend,
        "problems": run.problems,
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
        "strings": strings.table,
        "media": strings.media,  # keyed by content hash: a blob two jobs share is embedded once
    }


def _embed(data: dict[str, Any]) -> str:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    # Inside <script>, "</" could close the tag and "<!--" open a comment: escape both (still valid JSON).
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def render_html(data: dict[str, Any]) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    title = f"flowllm report: {data['title']}"
    return (
        _TEMPLATE.replace("%%TITLE%%", _escape(title)).replace("%%GENERATED%%", stamp).replace("%%DATA%%", _embed(data))
    )


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


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%%TITLE%%</title>
<style>
:root { --ok:#1a7f37; --bad:#cf222e; --warn:#9a6700; --muted:#656d76; --line:#d0d7de; --bg:#f6f8fa; --accent:#0969da; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1f2328; }
header { background: #24292f; color: #fff; padding: 12px 20px; }
header h1 { font-size: 17px; margin: 0; font-weight: 600; word-break: break-all; }
header .sub { color: #c9d1d9; font-size: 12px; }
main { padding: 16px 20px; max-width: 1500px; }
h2 { font-size: 16px; margin: 22px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 14px; margin: 14px 0 6px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 120px; background: #fff; }
.card .k { color: var(--muted); font-size: 12px; } .card .v { font-size: 18px; font-weight: 600; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); position: sticky; top: 0; }
th.sortable { cursor: pointer; user-select: none; } th.sortable:hover { color: var(--accent); }
th .arrow { color: var(--muted); font-size: 10px; }
tbody tr.task-row { cursor: pointer; } tbody tr.task-row:hover { background: #eef6ff; }
tbody tr.selected { background: #ddf4ff; }
.ok { color: var(--ok); } .bad { color: var(--bad); } .warn { color: var(--warn); } .muted { color: var(--muted); }
.pill { display: inline-block; border-radius: 10px; padding: 0 7px; font-size: 12px; border: 1px solid currentColor; }
.filters { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; margin: 8px 0; }
.filters label { font-size: 13px; color: var(--muted); }
select, input[type=search] { font: inherit; padding: 2px 6px; }
#task-detail { margin-top: 14px; }
.panel { border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px; margin: 10px 0; background: #fff; }
.turn { border-left: 3px solid var(--accent); padding-left: 10px; margin: 14px 0; }
.turn.has-error { border-left-color: var(--bad); }
.bar { display: flex; height: 18px; border-radius: 3px; overflow: hidden; background: var(--bg); margin: 4px 0 6px; }
.bar span { display: block; min-width: 3px; border-right: 1px solid #fff; }
.seg-ok { background: #54aeff; } .seg-error { background: var(--bad); } .seg-unknown { background: #d4a72c; }
.seg-call_model { background: #8250df; } .seg-dispatch_tools { background: #1a7f37; }
details.node { border: 1px solid var(--line); border-radius: 4px; margin: 3px 0; }
details.node > summary { cursor: pointer; padding: 3px 8px; background: var(--bg); font-family: ui-monospace, monospace; font-size: 12px; }
details.node[open] > summary { border-bottom: 1px solid var(--line); }
.node-body { padding: 6px 10px; }
pre { background: var(--bg); border: 1px solid var(--line); border-radius: 4px; padding: 8px; overflow: auto; max-height: 480px;
      white-space: pre-wrap; word-break: break-word; font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; margin: 4px 0; }
.call { border: 1px dashed var(--line); border-radius: 4px; padding: 6px 10px; margin: 6px 0; }
.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; }
.kv .k { color: var(--muted); }
button.small { font-size: 11px; padding: 1px 6px; cursor: pointer; }
.matrix td.c { text-align: center; }
.replay-exact { color: var(--ok); } .replay-diverged { color: #8250df; } .replay-missing { color: var(--bad); } .replay-unverified { color: var(--warn); }
.card.replay .sub { color: var(--muted); font-size: 12px; }
details.node.diverged { border-color: #8250df; } details.node.diverged > summary { background: #fbefff; }
#task-replay { border-color: #8250df; }
.extras { display: flex; flex-wrap: wrap; gap: 10px; align-items: flex-start; margin-top: 10px; }
.extras .panel { margin: 0; } .extras table { width: auto; } .extras td.num { text-align: right; }
.media { display: flex; flex-wrap: wrap; gap: 8px; margin: 4px 0 8px; }
figure.blob { margin: 0; } figure.blob img { display: block; max-width: 480px; max-height: 360px; border: 1px solid var(--line); background: var(--bg); }
figure.blob figcaption, .blob-line { font: 11px ui-monospace, monospace; color: var(--muted); }
.legend { margin-right: 10px; white-space: nowrap; } .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
</style>
</head>
<body>
<header><h1 id="title"></h1><div class="sub">flowllm run report &middot; generated %%GENERATED%%</div></header>
<main id="app"><noscript>This report needs JavaScript to render its data.</noscript></main>
<script id="report-data" type="application/json">%%DATA%%</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("report-data").textContent);
const STR = DATA.strings || [];
const REF = "\u00a7s", ERR = "\u00a7error";
// Blobs the run stored (blobs/<sha256>.<ext>) -> {label, src: a data: URI or null (too large, missing), note}.
const MEDIA = DATA.media || {};
const MEDIA_KINDS = ["image", "audio", "document"];
const DATA_URI = /^data:([\w.+-]+\/[\w.+-]+);base64,/i;
function inlineLabel(media, data) {
  if (data.endsWith("cut from the report]")) return "[inline base64 " + media + ", cut from the report]";
  const d = data.trim(), bytes = Math.max(0, Math.floor(d.length * 3 / 4) - (d.slice(-2).match(/=/g) || []).length);
  return "[inline base64 " + media + ", " + bytes.toLocaleString("en-US") + " bytes]";
}
// One line for a media value (a blob reference, or base64 still inline in a provider's request), else null.
function mediaLabel(v) {
  if (typeof v === "string") { const m = v.match(DATA_URI); return m ? inlineLabel(m[1], v.slice(m[0].length)) : null; }
  if (!v || typeof v !== "object" || Array.isArray(v)) return null;
  if (MEDIA_KINDS.includes(v.type) && typeof v.blob === "string" && !("data" in v)) return MEDIA[v.blob] ? MEDIA[v.blob].label : null;
  const media = v.media_type || v.mime_type || v.mimeType;
  return typeof media === "string" && typeof v.data === "string" && typeof v.text !== "string" ? inlineLabel(media, v.data) : null;
}
// The blobs a value references, each once, in order.
function blobsIn(v, out) {
  out = out || [];
  if (Array.isArray(v)) { for (const x of v) blobsIn(x, out); }
  else if (v && typeof v === "object") {
    if (MEDIA_KINDS.includes(v.type) && typeof v.blob === "string" && MEDIA[v.blob] && !out.includes(v.blob)) out.push(v.blob);
    for (const x of Object.values(v)) blobsIn(x, out);
  }
  return out;
}
function renderMedia(value) {
  const blobs = blobsIn(value);
  if (!blobs.length) return null;
  return el("div", {class: "media"}, blobs.map(b => {
    const m = MEDIA[b];
    return m.src ? el("figure", {class: "blob", "data-blob": b}, el("img", {src: m.src, alt: m.label, title: m.label}), el("figcaption", {text: m.label}))
      : el("div", {class: "blob-line", "data-blob": b, text: m.label});
  }));
}
function unpack(v) {
  if (Array.isArray(v)) return v.map(unpack);
  if (v && typeof v === "object") {
    const keys = Object.keys(v);
    if (keys.length === 1 && keys[0] === REF) return STR[v[REF]];
    const out = {}; for (const k of keys) out[k] = unpack(v[k]); return out;
  }
  return v;
}
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v; else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v); else node.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}
function fmt(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : String(Math.round(v * 1000) / 1000);
  if (typeof v === "object") { const e = Object.entries(v); return e.length ? e.map(([k, x]) => k + ": " + x).join(", ") : "-"; }
  return String(v);
}
function secs(v) { return v === null || v === undefined ? "?" : (v < 0.001 ? "<1 ms" : v < 1 ? Math.round(v * 1000) + " ms" : v.toFixed(2) + " s"); }
// A YAML-like rendering: code and prompts keep their line breaks instead of showing \n escapes.
function pretty(v, ind) {
  ind = ind || "";
  const label = mediaLabel(v);
  if (label !== null) return label;
  if (v === null || typeof v !== "object") {
    if (typeof v === "string" && v.includes("\n")) return "|\n" + v.split("\n").map(l => ind + "  " + l).join("\n");
    return JSON.stringify(v);
  }
  if (Array.isArray(v)) {
    if (!v.length) return "[]";
    return v.map(x => "\n" + ind + "- " + pretty(x, ind + "  ").replace(/^\n\s*/, "")).join("");
  }
  const keys = Object.keys(v);
  if (!keys.length) return "{}";
  return keys.map(k => "\n" + ind + k + ": " + pretty(v[k], ind + "  ")).join("");
}
function prettyText(v) { return pretty(v).replace(/^\n/, ""); }
function statusClass(s, correct) { return s === "completed" ? (correct ? "ok" : "warn") : "bad"; }
function statusLabel(t) { return t.status === "completed" && !t.correct ? "wrong answer" : (t.limit ? t.status + " (" + t.limit + ")" : t.status); }

function usd(v) {
  if (v === null || v === undefined) return "-";
  return v < 1 ? "$" + v.toFixed(4) : "$" + v.toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2});
}
function tokens(v, estimated) { return v === null || v === undefined ? "-" : (estimated ? "~" : "") + v.toLocaleString("en-US"); }
function pct(v) { return typeof v === "number" ? (v * 100).toFixed(1) + "%" : "-"; }
function replayCounts(r) {
  return ["exact", "diverged", "missing", "unverified"].filter(k => k !== "unverified" || r[k]).map(k => r[k] + " " + k).join(" \u00b7 ");
}
function cards(summary, spend, replay) {
  const s = summary || {};
  const u = s.usage || {};
  // A replay is scored on the tasks that replayed exactly: the others' answers came from stale replies.
  const accuracy = replay ? ["accuracy (exact replays)", pct(replay.accuracy_exact) + " (" + fmt(replay.exact_correct) + "/" + fmt(replay.exact) + ")"]
    : ["accuracy", pct(s.accuracy) + " (" + fmt(s.correct) + "/" + fmt(s.tasks) + ")"];
  const items = [accuracy, ["completed", fmt(s.completed)],
    ["failed", fmt(s.failed)], ["turns", fmt(s.turns)], ["tool calls", fmt(s.tool_calls)],
    ["bad blocks", fmt(s.bad_tool_calls)], ["failed calls", fmt(s.failed_tool_calls)], ["parse rate", fmt(s.parse_rate)],
    ["tokens in / out", fmt(u.input_tokens) + " / " + fmt(u.output_tokens)], ["wall time", s.wall_seconds ? secs(s.wall_seconds) : "-"]];
  if (spend) {
    // Counted from usage.jsonl; else a replay (nothing billed) or an older run (the tasks' recorded usage).
    const from = spend.source === "replay" ? " (replay)" : spend.source === "recorded" ? " (recorded)" : "";
    items.push(["cost", usd(spend.cost_usd) + from], ["billed tokens", tokens(spend.tokens, spend.estimated) + from],
      ["retries / fallbacks", fmt(spend.retries) + " / " + fmt(spend.fallbacks)]);
  }
  const box = el("div", {class: "cards", id: "summary-cards"}, items.map(([k, v]) => el("div", {class: "card"}, el("div", {class: "k", text: k}), el("div", {class: "v", text: v}))));
  if (replay) box.prepend(el("div", {class: "card replay", id: "replay-card"}, el("div", {class: "k", text: "replay"}),
    el("div", {class: "v", text: replayCounts(replay)}),
    el("div", {class: "sub", text: "accuracy " + pct(replay.accuracy_exact) + " on exact replays (" + fmt(replay.exact_correct) + "/" + fmt(replay.exact)
      + "), " + pct(replay.accuracy_all) + " on all tasks (" + fmt(replay.correct) + "/" + fmt(replay.tasks) + ")"})));
  return box;
}

// summary.json -> tools.unavailable: servers disabled (a missing key) or failed to start; null is "not known".
function toolsCard(tools) {
  if (!tools) return null;
  const box = el("div", {class: "panel", id: "tools-unavailable"}, el("strong", {text: "Tool servers unavailable"}));
  if (!tools.known) {
    box.append(el("div", {class: "warn", text: "not known: summary.json has null (a run split over worker processes does not collect their tool servers)"}));
    return box;
  }
  box.append(el("div", {class: "muted", text: "their tools were not offered to the model"}),
    el("table", {}, el("thead", {}, el("tr", {}, el("th", {text: "server"}), el("th", {text: "why"}))),
      el("tbody", {}, Object.entries(tools.servers).map(([name, why]) => el("tr", {"data-server": name}, el("td", {class: "warn", text: name}), el("td", {text: why}))))));
  return box;
}

// summary.json -> breakdown: a judged benchmark's accuracy per category (topic, answer type...).
function breakdownCard(breakdown) {
  const fields = Object.entries(breakdown || {});
  if (!fields.length) return null;
  return el("div", {class: "panel", id: "breakdown"}, el("strong", {text: "Accuracy by category"}),
    fields.map(([name, rows]) => el("table", {class: "breakdown", "data-field": name},
      el("thead", {}, el("tr", {}, el("th", {text: name}), el("th", {text: "correct"}), el("th", {text: "accuracy"}))),
      el("tbody", {}, rows.map(r => el("tr", {}, el("td", {text: r.value}), el("td", {class: "num", text: fmt(r.correct) + "/" + fmt(r.tasks)}),
        el("td", {class: "num", text: pct(r.accuracy)})))))));
}

const COLUMNS = [["task_id", "task"], ["level", "level"], ["status", "status"], ["correct", "correct"], ["answer", "answer"],
  ["ground_truth", "expected"], ["turns", "turns"], ["tool_calls", "calls"], ["bad_tool_calls", "bad"],
  ["failed_tool_calls", "failed"], ["repairs", "repairs"], ["billed_tokens", "tokens"], ["cost_usd", "cost"],
  ["wall_seconds", "time"], ["error", "error"]];

const REPLAY_COLUMN = ["replay_label", "replay"];

function renderRun(container, run) {
  container.innerHTML = "";
  const tasks = run.tasks;
  // A replay's tasks say whether they replayed exactly; a run that was not a replay has no such column.
  const columns = run.replay ? COLUMNS.slice(0, 3).concat([REPLAY_COLUMN], COLUMNS.slice(3)) : COLUMNS;
  const settings = Object.entries(run.settings).filter(([, v]) => v !== null && v !== undefined);
  container.append(el("h2", {text: "Summary"}),
    el("div", {class: "panel"}, el("div", {class: "kv"}, settings.map(([k, v]) => [el("span", {class: "k", text: k}), el("span", {text: fmt(v)})]),
      run.overrides && run.overrides.length ? [el("span", {class: "k", text: "overrides"}), el("code", {text: run.overrides.join(" ")})] : [],
      el("span", {class: "k", text: "path"}), el("code", {text: run.path}))),
    cards(run.summary, run.spend, run.replay));
  const extras = [toolsCard(run.tools_unavailable), breakdownCard(run.breakdown)].filter(x => x);
  if (extras.length) container.append(el("div", {class: "extras"}, extras));
  if (run.problems && run.problems.length)
    container.append(el("div", {class: "panel warn", id: "run-problems"}, el("strong", {text: "Problems reading the run"}), el("ul", {}, run.problems.map(p => el("li", {text: p})))));

  const statuses = [...new Set(tasks.map(statusLabel))].sort();
  const levels = [...new Set(tasks.map(t => t.level).filter(l => l !== null && l !== undefined))].sort((a, b) => a - b);
  const statusSel = el("select", {id: "status-filter"}, el("option", {value: "", text: "all"}), statuses.map(s => el("option", {value: s, text: s})));
  const levelSel = el("select", {id: "level-filter"}, el("option", {value: "", text: "all"}), levels.map(l => el("option", {value: String(l), text: "level " + l})));
  const replayStatuses = [...new Set(tasks.map(t => t.replay ? t.replay.status : null).filter(v => v))].sort();
  const replaySel = run.replay ? el("select", {id: "replay-filter"}, el("option", {value: "", text: "all"}), replayStatuses.map(s => el("option", {value: s, text: s}))) : null;
  const search = el("input", {type: "search", id: "search", placeholder: "task id, answer, error..."});
  const count = el("span", {class: "muted", id: "task-count"});
  const tbody = el("tbody");
  const head = el("tr");
  const table = el("table", {id: "task-table"}, el("thead", {}, head), tbody);
  const detail = el("div", {id: "task-detail"});
  let sortKey = null, sortDir = 1;
  for (const [key, label] of columns) {
    const th = el("th", {class: "sortable", "data-key": key}, label, " ", el("span", {class: "arrow"}));
    th.addEventListener("click", () => { sortDir = sortKey === key ? -sortDir : 1; sortKey = key; draw(); });
    head.append(th);
  }
  function cmp(a, b) {
    const x = a[sortKey], y = b[sortKey];
    if (x === y) return 0; if (x === null || x === undefined) return 1; if (y === null || y === undefined) return -1;
    if (typeof x === "number" && typeof y === "number") return (x - y) * sortDir;
    return String(fmt(x)).localeCompare(String(fmt(y)), undefined, {numeric: true}) * sortDir;
  }
  function draw() {
    const st = statusSel.value, lv = levelSel.value, rp = replaySel ? replaySel.value : "", q = search.value.trim().toLowerCase();
    let rows = tasks.filter(t => (!st || statusLabel(t) === st) && (!lv || String(t.level) === lv) && (!rp || (t.replay && t.replay.status === rp))
      && (!q || [t.task_id, t.answer, t.ground_truth, t.error].some(v => v && String(v).toLowerCase().includes(q))));
    if (sortKey) rows = rows.slice().sort(cmp);
    for (const th of head.children) th.querySelector(".arrow").textContent = th.dataset.key === sortKey ? (sortDir > 0 ? "\u25b2" : "\u25bc") : "";
    tbody.innerHTML = "";
    for (const t of rows) {
      const tr = el("tr", {class: "task-row", "data-task": t.task_id, "data-status": statusLabel(t), "data-level": t.level, "data-replay": t.replay ? t.replay.status : null},
        columns.map(([key]) => {
          let v = t[key];
          if (key === "replay_label") return el("td", {class: "replay-col"}, el("span", {class: "pill replay-" + (t.replay ? t.replay.status : "none"), text: fmt(v)}));
          if (key === "status") return el("td", {}, el("span", {class: "pill " + statusClass(t.status, t.correct), text: statusLabel(t)}));
          if (key === "correct") return el("td", {class: v ? "ok" : "bad", text: fmt(v)});
          if (key === "wall_seconds") return el("td", {text: v === null || v === undefined ? "-" : secs(v)});
          if (key === "billed_tokens") return el("td", {class: "num cost-col", text: tokens(v, t.tokens_estimated)});
          if (key === "cost_usd") return el("td", {class: "num cost-col", text: t.billed_tokens === null ? "-" : usd(v)});
          if (key === "error" && v) v = String(v).split("\n")[0].slice(0, 140);
          return el("td", {text: fmt(v)});
        }));
      tr.addEventListener("click", () => showTask(t, tr));
      tbody.append(tr);
    }
    count.textContent = "showing " + rows.length + " of " + tasks.length;
  }
  function showTask(t, tr) {
    for (const r of tbody.querySelectorAll("tr.selected")) r.classList.remove("selected");
    if (tr) tr.classList.add("selected");
    renderTask(detail, t);
    detail.scrollIntoView({block: "start"});
  }
  statusSel.addEventListener("change", draw); levelSel.addEventListener("change", draw); search.addEventListener("input", draw);
  if (replaySel) replaySel.addEventListener("change", draw);
  container.append(el("h2", {text: "Tasks"}),
    el("div", {class: "filters"}, el("label", {}, "status ", statusSel), el("label", {}, "level ", levelSel),
      replaySel ? el("label", {}, "replay ", replaySel) : null, search, count),
    table, detail);
  draw();
  const wanted = decodeURIComponent((location.hash.match(/task=([^&]+)/) || [])[1] || "");
  const first = tasks.find(t => t.task_id === wanted);
  if (first) showTask(first, tbody.querySelector('tr[data-task="' + CSS.escape(first.task_id) + '"]'));
}

function renderTask(container, t) {
  container.innerHTML = "";
  const failures = t.failures || [];
  container.append(el("h2", {id: "detail-title"}, "Task ", el("code", {text: t.task_id}), " ",
    el("span", {class: "pill " + statusClass(t.status, t.correct), text: statusLabel(t)})));
  container.append(el("div", {class: "panel"}, el("div", {class: "kv"},
    [["answer", t.answer], ["expected", t.ground_truth], ["correct", t.correct], ["turns / stop", fmt(t.turns) + " / " + fmt(t.stop)],
     ["tool calls / bad / failed", fmt(t.tool_calls) + " / " + fmt(t.bad_tool_calls) + " / " + fmt(t.failed_tool_calls)],
     ["repairs", t.repairs], ["level", t.level], ["wall time", t.wall_seconds === null ? "-" : secs(t.wall_seconds)]]
      .map(([k, v]) => [el("span", {class: "k", text: k}), el("span", {text: fmt(v)})]),
    t.error ? [el("span", {class: "k", text: "error"}), el("pre", {class: "bad task-error", text: t.error})] : [])));
  if (failures.length)
    container.append(el("div", {class: "panel", id: "task-failures"}, el("strong", {text: "What went wrong"}),
      el("ul", {}, failures.map(f => el("li", {}, el("span", {class: "pill " + (f.kind === "wrong_answer" ? "warn" : "bad"), text: f.kind}), " ",
        f.turn !== null && f.turn !== undefined ? "turn " + f.turn + (f.node ? " / " + f.node : "") + ": " : "", f.reason)))));
  for (const p of t.problems || []) container.append(el("div", {class: "warn", text: "! " + p}));
  const replay = t.replay_detail ? unpack(t.replay_detail) : null;
  if (replay) container.append(renderReplay(replay));
  const swatch = (cls, label) => el("span", {class: "legend"}, el("i", {class: cls}), label);
  container.append(el("h3", {text: "Timeline"}), el("div", {class: "muted"}, "bar widths are node durations: ",
    swatch("seg-call_model", "call_model"), swatch("seg-dispatch_tools", "dispatch_tools"), swatch("seg-ok", "other nodes"),
    swatch("seg-error", "failed node"), " \u00b7 click a node below to see its input and output"));
  for (const turn of t.turn_records) container.append(renderTurn(turn, replay));
}

const REPLAY_MEANING = {
  missing: "the pipeline asked for a reply the saved run never had: the task failed (see its error)",
  unverified: "the saved run kept no node outputs to compare with (recorder.snapshot=errors or none)",
  diverged: "the saved replies after this node answered the saved run's conversation, not this one: the task is not scored in the replay's accuracy (accuracy_all counts it)"};

function renderReplay(r) {
  const box = el("div", {class: "panel", id: "task-replay"}, el("strong", {text: "Replay "}),
    el("span", {class: "pill replay-" + r.status, text: r.label}));
  const rows = [];
  if (r.path) rows.push(["what changed", (r.node || "") + " output, at " + r.path + (r.offset ? " (they differ from character " + r.offset + ")" : "")]);
  else if (r.what) rows.push(["what changed", r.what]);
  if (r.saved_run) rows.push(["saved run", r.saved_run]);
  if (rows.length) box.append(el("div", {class: "kv"}, rows.map(([k, v]) => [el("span", {class: "k", text: k}), el("span", {class: "replay-what", text: v})])));
  if (r.path) {
    for (const [label, value, cls] of [["in the saved run", r.saved, "replay-saved"], ["in this run", r.new, "replay-new"]])
      box.append(el("div", {class: "muted", text: label}), el("pre", {class: cls, text: typeof value === "string" ? value : prettyText(value)}));
  }
  if (r.note) box.append(el("div", {class: "warn", text: r.note}));
  box.append(el("div", {class: "muted", text: REPLAY_MEANING[r.status] || ""}));
  return box;
}

function renderTurn(packed, replay) {
  // Replies and calls are unpacked when a task is opened; node inputs and outputs only when a node is.
  const turn = Object.assign({}, packed, {text: unpack(packed.text), calls: unpack(packed.calls), bad_calls: unpack(packed.bad_calls)});
  const hasError = turn.nodes.some(n => n.status === "error") || turn.bad_calls.length || turn.calls.some(c => c.repair_error || c.result_error);
  const total = turn.nodes.reduce((s, n) => s + (n.duration_s || 0), 0) || 1;
  const box = el("div", {class: "turn" + (hasError ? " has-error" : ""), "data-turn": turn.number},
    el("strong", {text: "turn " + turn.number + (turn.agent !== "main" ? " (agent " + turn.agent + ")" : "")}),
    el("span", {class: "muted", text: "  " + secs(turn.duration_s) + (turn.stop_reason ? "  \u00b7 stop: " + turn.stop_reason : "")}));
  box.append(el("div", {class: "bar", title: "node durations"}, turn.nodes.map(n => el("span", {
    class: n.status === "ok" ? "seg-ok seg-" + n.name : "seg-" + n.status,
    style: "width:" + Math.max(0.5, 100 * (n.duration_s || 0) / total) + "%",
    title: n.folder + ": " + secs(n.duration_s) + " (" + n.status + ")"}))));
  if (turn.text !== null && turn.text !== undefined)
    box.append(el("div", {class: "muted", text: "model reply"}), el("pre", {class: "reply", text: turn.text}));
  for (const c of turn.calls) {
    box.append(el("div", {class: "call"},
      el("div", {}, el("strong", {text: c.label}), "  ",
        c.repair_error ? el("span", {class: "bad repair", text: "arguments not repaired: " + c.repair_error})
                       : el("span", {class: c.repair_stage === "strict" ? "muted repair" : "warn repair", text: "repair: " + fmt(c.repair_stage)})),
      el("details", {}, el("summary", {text: "arguments as written"}), el("pre", {text: c.arguments_text})),
      c.arguments ? el("pre", {class: "arguments", text: prettyText(c.arguments)}) : null,
      c.result !== null && c.result !== undefined ? [el("div", {class: c.result_error ? "bad" : "muted", text: c.result_error ? "tool error" : "result"}), el("pre", {class: "result", text: c.result})] : null));
  }
  for (const b of turn.bad_calls)
    box.append(el("div", {class: "call bad"}, el("strong", {text: "bad tool call: " + b.reason}), el("pre", {text: b.raw})));
  for (const p of turn.problems) box.append(el("div", {class: "warn", text: "! " + p}));
  const here = replay && replay.folder && replay.turn === turn.number && replay.agent === turn.agent ? replay.folder : null;
  for (const n of turn.nodes) box.append(renderNode(n, n.folder === here));
  return box;
}

function renderNode(n, diverged) {
  const cls = n.status === "ok" ? "ok" : n.status === "error" ? "bad" : "warn";
  const d = el("details", {class: "node" + (diverged ? " diverged" : ""), "data-node": n.folder},
    el("summary", {}, n.folder, "  ", el("span", {class: cls, text: n.status}), "  ", el("span", {class: "muted", text: secs(n.duration_s)}),
      diverged ? el("span", {class: "replay-diverged", text: "  replay diverged here"}) : null,
      n.error ? el("span", {class: "bad", text: "  " + n.error.split("\n")[0]}) : null));
  let filled = false;
  d.addEventListener("toggle", () => {
    if (!d.open || filled) return;
    filled = true;
    const body = el("div", {class: "node-body"});
    if (n.error) body.append(el("div", {class: "bad", text: n.error}));
    if (n.traceback) body.append(el("details", {}, el("summary", {text: "traceback"}), el("pre", {class: "bad", text: unpack(n.traceback)})));
    for (const part of ["input", "output"]) {
      const raw = n[part];
      if (raw && typeof raw === "object" && ERR in raw) { body.append(el("div", {class: part === "output" && n.status === "error" ? "muted" : "warn", text: part + ": " + raw[ERR]})); continue; }
      const value = unpack(raw);
      const pre = el("pre", {class: "node-" + part, text: prettyText(value)});
      let asJson = false;
      const toggle = el("button", {class: "small", text: "JSON", onclick: (e) => { e.preventDefault(); asJson = !asJson; pre.textContent = asJson ? JSON.stringify(value, null, 2) : prettyText(value); toggle.textContent = asJson ? "readable" : "JSON"; }});
      body.append(el("div", {}, el("strong", {text: part}), " ", toggle), pre, renderMedia(value));
    }
    d.append(body);
  });
  return d;
}

function renderComparison(container, runs) {
  const cols = [["job", r => r.label], ["overrides", r => (r.overrides || []).join(" ")], ["provider", r => r.settings.provider],
    ["model", r => r.settings.model], ["runner", r => r.settings.runner], ["repair", r => r.settings.repair],
    ["accuracy", r => typeof r.summary.accuracy === "number" ? (r.summary.accuracy * 100).toFixed(1) + "%" : "-"],
    ["correct", r => fmt(r.summary.correct) + "/" + fmt(r.summary.tasks)], ["failed", r => fmt(r.summary.failed)],
    ["replay", r => r.replay ? replayCounts(r.replay) : "-"],
    ["tool calls", r => fmt(r.summary.tool_calls)], ["bad", r => fmt(r.summary.bad_tool_calls)],
    ["failed calls", r => fmt(r.summary.failed_tool_calls)], ["parse rate", r => fmt(r.summary.parse_rate)],
    ["repairs", r => fmt(r.summary.repairs)], ["tokens in / out", r => { const u = r.summary.usage || {}; return fmt(u.input_tokens) + " / " + fmt(u.output_tokens); }],
    ["billed tokens", r => tokens((r.spend || {}).tokens, (r.spend || {}).estimated)], ["cost", r => usd((r.spend || {}).cost_usd)],
    ["wall", r => r.summary.wall_seconds ? secs(r.summary.wall_seconds) : "-"]];
  container.append(el("h2", {text: "Sweep comparison"}),
    el("table", {id: "comparison"}, el("thead", {}, el("tr", {}, cols.map(([h]) => el("th", {text: h})))),
      el("tbody", {}, runs.map(r => el("tr", {"data-job": r.label}, cols.map(([, f]) => el("td", {text: f(r)})))))));
  const ids = [...new Set(runs.flatMap(r => r.tasks.map(t => unpack(t.task_id))))].sort();
  const byRun = runs.map(r => Object.fromEntries(r.tasks.map(t => [unpack(t.task_id), t])));
  container.append(el("h3", {text: "Tasks across the sweep"}),
    el("table", {class: "matrix", id: "matrix"}, el("thead", {}, el("tr", {}, el("th", {text: "task"}), runs.map(r => el("th", {text: "job " + r.label})))),
      el("tbody", {}, ids.map(id => el("tr", {}, el("td", {text: id}), byRun.map(m => {
        const t = m[id];
        if (!t) return el("td", {class: "c muted", text: "-"});
        const ok = t.status === "completed" && t.correct;
        return el("td", {class: "c " + statusClass(t.status, t.correct), title: fmt(unpack(t.answer)), text: ok ? "\u2713" : t.status === "completed" ? "\u2717" : t.status});
      }))))));
}

function main() {
  document.getElementById("title").textContent = DATA.title;
  const app = document.getElementById("app");
  app.innerHTML = "";
  for (const p of DATA.problems || []) app.append(el("div", {class: "panel warn", text: p}));
  if (!DATA.runs.length) { app.append(el("p", {text: "No run could be read."})); return; }
  const runBox = el("div", {id: "run"});
  if (DATA.kind === "multirun") {
    renderComparison(app, DATA.runs);
    const sel = el("select", {id: "run-select"}, DATA.runs.map((r, i) => el("option", {value: String(i), text: "job " + r.label + (r.overrides.length ? ": " + r.overrides.join(" ") : "")})));
    sel.addEventListener("change", () => renderRun(runBox, DATA.runs[Number(sel.value)]));
    app.append(el("h2", {text: "One job in detail"}), el("div", {class: "filters"}, el("label", {}, "job ", sel)));
  }
  app.append(runBox);
  renderRun(runBox, DATA.runs[0]);
}
main();
</script>
</body>
</html>
"""  # noqa: E501  (the page's inline CSS and JavaScript: long lines are clearer than wrapped ones there)
