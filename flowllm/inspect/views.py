"""What a person wants from a turn, pulled out of its node artifacts: the reply, the calls, what went wrong.

Nodes are found by the names their *outputs* carry (``response``, ``tool_calls``, ``prepared_calls``,
``tool_results``), not by folder names, so a pipeline that renames or reorders nodes still reads. These views
are plain data: the terminal commands, ``--json`` and the HTML report all render the same ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowllm.engine.blobs import describe_blob
from flowllm.inspect.artifacts import (
    ARTIFACT_FILES,
    MAIN_AGENT,
    NodeRecord,
    RunRecord,
    TaskRecord,
    TurnRecord,
    read_artifact,
    summary_figures,
)
from flowllm.inspect.replay import is_replay
from flowllm.rundir.layout import LEDGER_FILE, RESULT_FILE, TIMING_FILE, RunLayout
from flowllm.rundir.results import CostBlock, LevelTally, RunSummary, ToolsBlock
from flowllm.spend.spending import RunBill
from flowllm.spend.task_usage import read_bills

# Node folders whose outputs never hold what the views look for, and can be large (whole raw exchanges or
# histories): skipped when digging for replies and calls.
_BULKY = frozenset({"call_model", "trim_history", "mark_cache"})


@dataclass
class CallView:
    """One tool call of a turn: as parsed, as repaired, and what the tool said."""

    id: str
    server: str | None
    name: str
    arguments_text: str
    arguments: dict[str, Any] | None
    repair_stage: str | None
    repair_error: str | None
    result: str | None = None
    result_error: bool = False

    @property
    def label(self) -> str:
        return f"{self.server}.{self.name}" if self.server else self.name

    @property
    def ok(self) -> bool:
        return self.repair_error is None and not self.result_error


@dataclass
class BadCallView:
    reason: str
    raw: str


@dataclass
class NodeView:
    folder: str
    name: str
    status: str
    duration_s: float | None
    started_at: str | None
    error: str | None


@dataclass
class TurnView:
    agent: str
    number: int
    duration_s: float
    text: str | None = None
    stop_reason: str | None = None
    usage: dict[str, Any] | None = None
    calls: list[CallView] = field(default_factory=list)
    bad_calls: list[BadCallView] = field(default_factory=list)
    nodes: list[NodeView] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[NodeView]:
        return [n for n in self.nodes if n.status == "error"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_view(node: NodeRecord) -> NodeView:
    return NodeView(node.folder, node.name, node.status, node.duration_s, node.started_at, node.error)


def _outputs(turn: TurnRecord, problems: list[str]) -> dict[str, Any]:
    """Every output key of the turn's non-bulky nodes, merged (later nodes do not overwrite earlier keys)."""
    merged: dict[str, Any] = {}
    for node in turn.nodes:
        if node.name in _BULKY:
            continue
        out = node.output()
        if not out.ok:
            if not out.missing:
                problems.append(f"{node.folder}: {out.error}")
            continue
        if isinstance(out.value, dict):
            for key, value in out.value.items():
                merged.setdefault(key, value)
    return merged


def turn_view(turn: TurnRecord, agent: str = MAIN_AGENT) -> TurnView:
    view = TurnView(agent=agent, number=turn.number, duration_s=round(turn.duration_s, 6))
    view.nodes = [node_view(n) for n in turn.nodes]
    for n in turn.nodes:
        if not n.meta.ok and not n.meta.missing:
            view.problems.append(f"{n.folder}: {n.meta.error}")
    outs = _outputs(turn, view.problems)
    response = outs.get("response")
    if isinstance(response, dict):
        view.text = str(response.get("text") or "")
        view.stop_reason = response.get("stop_reason")
        view.usage = response.get("usage") if isinstance(response.get("usage"), dict) else None
    results = {str(r.get("call_id")): r for r in outs.get("tool_results") or [] if isinstance(r, dict)}
    prepared = outs.get("prepared_calls")
    parsed = outs.get("tool_calls")
    if isinstance(prepared, list):
        for p in prepared:
            if not isinstance(p, dict):
                continue
            call = p.get("call") or {}
            view.calls.append(
                CallView(
                    id=str(call.get("id", "")),
                    server=call.get("server"),
                    name=str(call.get("name", "")),
                    arguments_text=str(call.get("arguments_text", "")),
                    arguments=p.get("arguments") if isinstance(p.get("arguments"), dict) else None,
                    repair_stage=p.get("repair_stage"),
                    repair_error=p.get("error") or (None if p.get("arguments") is not None else "not repaired"),
                )
            )
    elif isinstance(parsed, list):  # a pipeline without repair_arguments
        for c in parsed:
            if isinstance(c, dict):
                view.calls.append(
                    CallView(
                        str(c.get("id", "")),
                        c.get("server"),
                        str(c.get("name", "")),
                        str(c.get("arguments_text", "")),
                        None,
                        None,
                        None,
                    )
                )
    for call in view.calls:
        result = results.get(call.id)
        if result is not None:
            call.result = str(result.get("content", ""))
            media = [describe_blob(i) for i in result.get("images") or [] if isinstance(i, dict)]
            call.result = "\n".join(t for t in (call.result, *media) if t)  # [image 64x64 png, blobs/ab12...]
            call.result_error = bool(result.get("is_error"))
    for bad in outs.get("bad_tool_calls") or []:
        if isinstance(bad, dict):
            view.bad_calls.append(BadCallView(str(bad.get("reason", "")), str(bad.get("raw", ""))))
    return view


def task_turn_views(task: TaskRecord) -> list[TurnView]:
    return [turn_view(t, agent) for agent, t in task.all_turns()]


def _timing(task: TaskRecord) -> dict[str, Any]:
    """``timing.json`` beside ``result.json`` (timings are kept out of results so runs compare with diff -r)."""
    try:
        value = json.loads((task.path / TIMING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class ResultRow:
    """The task's result.json fields a table shows, with safe defaults for unfinished or unreadable tasks
    (``to_dict``: the row ``tasks --json`` and ``task --json`` print, in this order)."""

    task_id: str
    level: int | None
    status: str
    correct: bool | None
    answer: str | None
    ground_truth: str | None
    turns: int
    stop: str | None
    limit: str | None  # status limit: which of agent.limits ended it
    halt_detail: str | None  # status limit or budget: what reached it
    tool_calls: int
    bad_tool_calls: int
    failed_tool_calls: int
    repairs: dict[str, int]
    error: str | None
    wall_seconds: float | None
    input_tokens: int | None
    output_tokens: int | None
    problems: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def result_row(task: TaskRecord) -> ResultRow:
    """The task's row: its result's fields, with safe defaults for unfinished or unreadable tasks."""
    result = task.record
    usage = result.usage or {}
    wall_seconds = result.wall_seconds if result.wall_seconds is not None else _timing(task).get("wall_seconds")
    return ResultRow(
        task_id=task.task_id,
        level=task.level,
        status=task.status,
        correct=task.correct,
        answer=result.answer,
        ground_truth=result.ground_truth,
        turns=len(task.turns) if task.result_record is None else result.turns,
        stop=result.stop,
        limit=result.limit,
        halt_detail=result.halt_detail,
        tool_calls=result.tool_calls,
        bad_tool_calls=result.bad_tool_calls,
        failed_tool_calls=result.failed_tool_calls,
        repairs=result.repairs or {},
        error=task.error,
        wall_seconds=wall_seconds,
        input_tokens=usage.get("input_tokens") if isinstance(usage, dict) else None,
        output_tokens=usage.get("output_tokens") if isinstance(usage, dict) else None,
        problems=list(task.problems),
    )


@dataclass
class Failure:
    """One thing that went wrong, located: what kind, where, and why."""

    # task_failed | wrong_answer | bad_tool_call | repair_failed | tool_error | node_error | unreadable
    # | limit (<name>) | budget (a per-task limit or the run's budget ended the task)
    kind: str
    task_id: str
    reason: str
    agent: str = MAIN_AGENT
    turn: int | None = None
    node: str | None = None
    detail: str | None = None

    @property
    def where(self) -> str:
        parts = [self.task_id]
        if self.agent != MAIN_AGENT:
            parts.append(f"agent {self.agent}")
        if self.turn is not None:
            parts.append(f"turn {self.turn}")
        if self.node:
            parts.append(self.node)
        return " / ".join(parts)


def task_failures(task: TaskRecord, turns: list[TurnView] | None = None) -> list[Failure]:
    out: list[Failure] = []
    tid = task.task_id
    if task.status in ("limit", "budget"):  # ended by agent.limits or experiment.budget (spending.py)
        result = task.record
        name = f" ({result.limit})" if result.limit else ""
        out.append(Failure(f"{task.status}{name}", tid, result.halt_detail or f"status {task.status}"))
    elif task.status not in ("completed",):
        out.append(Failure("task_failed", tid, task.error or f"status {task.status}"))
    elif task.correct is False and task.record.ground_truth is not None:
        answer, truth = task.record.answer, task.record.ground_truth
        out.append(Failure("wrong_answer", tid, f"answered {answer!r}, expected {truth!r}"))
    for problem in task.problems:
        if RESULT_FILE not in problem:  # already reported as the task's failure
            out.append(Failure("unreadable", tid, problem))
    for view in turns if turns is not None else task_turn_views(task):
        for node in view.errors:
            out.append(Failure("node_error", tid, node.error or "error", view.agent, view.number, node.folder))
        for bad in view.bad_calls:
            out.append(Failure("bad_tool_call", tid, bad.reason, view.agent, view.number, detail=bad.raw))
        for call in view.calls:
            if call.repair_error:
                out.append(
                    Failure(
                        "repair_failed",
                        tid,
                        f"{call.label}: {call.repair_error}",
                        view.agent,
                        view.number,
                        detail=call.arguments_text,
                    )
                )
            elif call.result_error:
                out.append(
                    Failure(
                        "tool_error",
                        tid,
                        f"{call.label}: {first_line(call.result or '')}",
                        view.agent,
                        view.number,
                        detail=call.result,
                    )
                )
        for problem in view.problems:
            out.append(Failure("unreadable", tid, problem, view.agent, view.number))
    return out


def run_failures(run: RunRecord) -> list[Failure]:
    return [f for task in run.tasks for f in task_failures(task)]


def first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class GrepHit:
    """One match: where it first appears in its turn, and which later nodes of that turn repeat it.

    Every node's input repeats the conversation so far, so the same text would otherwise be listed once per
    node. A match is the same when the whole value holding it is (a repaired argument that differs from the
    text it was repaired from is a match of its own).
    """

    task_id: str
    agent: str
    turn: int | None
    node: str | None
    file: str
    path: str
    snippet: str
    repeats: int = 0  # later nodes of the same turn that hold the same match
    repeated_in: list[str] = field(default_factory=list)  # their folders, in order


def _strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            key_path = f"{path}.{k}" if path else str(k)
            yield key_path, str(k)
            yield from _strings(v, key_path)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")
    elif value is not None and not isinstance(value, bool):
        yield path, str(value)


def _snippet(text: str, start: int, end: int, width: int = 60) -> str:
    left = max(0, start - width)
    right = min(len(text), end + width)
    body = text[left:right].replace("\n", "\\n")
    return ("..." if left else "") + body + ("..." if right < len(text) else "")


def _file_matches(rx: re.Pattern[str], path: Path) -> Iterator[tuple[str, str, str]]:
    """(where in the file, the value, snippet) of each value of an artifact that matches (its first match)."""
    art = read_artifact(path)
    if art.missing:
        return
    pairs: Iterator[tuple[str, str]]
    if art.ok:
        pairs = _strings(art.value)
    else:  # searched as raw text, so that a corrupt artifact can still be found
        pairs = iter([("(unreadable file)", path.read_bytes().decode("utf-8", "replace"))])
    for json_path, text in pairs:
        m = rx.search(text)  # one hit per value is enough to point at it
        if m is not None:
            yield json_path, text, _snippet(text, m.start(), m.end())


def grep_run(run: RunRecord, pattern: str, *, regex: bool = False, limit: int = 200) -> list[GrepHit]:
    """Occurrences of ``pattern`` (case-insensitive) in the string values of every artifact of the run.

    Values are searched decoded, so a newline or a quote matches as itself, not as its JSON escape. A match is
    listed once per turn, at the first node (and file) where it appears; the later nodes of that turn that
    repeat it (each node's input carries the history so far) are counted in ``repeats``. ``limit`` caps the
    listed matches; the turn where it is reached is still read to the end, so its counts are complete.
    """
    rx = re.compile(pattern if regex else re.escape(pattern), re.IGNORECASE)
    hits: list[GrepHit] = []

    for task in run.tasks:
        for json_path, _, snippet in _file_matches(rx, task.path / RESULT_FILE):
            if len(hits) >= limit:
                return hits
            hits.append(GrepHit(task.task_id, MAIN_AGENT, None, None, RESULT_FILE, json_path, snippet))
        for agent, turn in task.all_turns():
            if len(hits) >= limit:
                return hits
            first: dict[str, GrepHit] = {}  # a matching value -> the turn's hit for it
            for node in turn.nodes:
                for name in ARTIFACT_FILES:
                    for json_path, text, snippet in _file_matches(rx, node.path / name):
                        hit = first.get(text)
                        if hit is None:
                            if len(hits) >= limit:
                                continue  # the limit is reached: only this turn's repeats are still counted
                            hit = GrepHit(task.task_id, agent, turn.number, node.folder, name, json_path, snippet)
                            first[text] = hit
                            hits.append(hit)
                        elif hit.node != node.folder and node.folder not in hit.repeated_in:
                            hit.repeated_in.append(node.folder)
                            hit.repeats += 1
    return hits


# ----- media: images and other bytes in artifacts -------------------------------------------------------------
MEDIA_KINDS = frozenset({"image", "audio", "document"})
# A blob reference as BlobStore writes it: a file of the run's blobs/ folder named by its hash, nothing else.
BLOB_REF = re.compile(r"^blobs/[0-9a-f]{64}\.[A-Za-z0-9_]{1,16}$")
_DATA_URI = re.compile(r"^data:([\w.+-]+/[\w.+-]+);base64,", re.IGNORECASE)


def blob_ref(value: Any) -> str | None:
    """The ``blobs/<sha256>.<ext>`` path a media block points to (None for anything else)."""
    if not isinstance(value, dict) or value.get("type") not in MEDIA_KINDS or "data" in value:
        return None
    blob = value.get("blob")
    return blob if isinstance(blob, str) and BLOB_REF.match(blob) else None


def _base64_bytes(data: str) -> int:
    data = data.strip()
    return max(0, len(data) * 3 // 4 - data[-2:].count("="))


def media_label(value: Any) -> str | None:
    """One line for a media value, None for anything else: a blob reference as ``[image 64x40 png,
    blobs/ab12...]``; bytes still inline (a provider's request: a base64 source, a data: URI) as
    ``[inline base64 image/png, 136 bytes]``."""
    if isinstance(value, str):
        m = _DATA_URI.match(value)
        return f"[inline base64 {m.group(1)}, {_base64_bytes(value[m.end() :]):,} bytes]" if m else None
    if not isinstance(value, dict):
        return None
    if blob_ref(value) is not None:
        return describe_blob(value)
    media = value.get("media_type") or value.get("mime_type") or value.get("mimeType")
    data = value.get("data")
    if isinstance(media, str) and isinstance(data, str) and not isinstance(value.get("text"), str):
        return f"[inline base64 {media}, {_base64_bytes(data):,} bytes]"
    return None


def readable_media(value: Any) -> Any:
    """``value`` with each media block (a blob reference or inline base64) replaced by its one-line label."""
    label = media_label(value)
    if label is not None:
        return label
    if isinstance(value, dict):
        return {k: readable_media(v) for k, v in value.items()}
    if isinstance(value, list):
        return [readable_media(v) for v in value]
    return value


# ----- spend ---------------------------------------------------------------------------------------------------
SPEND_SOURCES = {
    LEDGER_FILE: LEDGER_FILE,
    "replay": f"nothing billed (a replay without {LEDGER_FILE})",
    "recorded": f"the tasks' results (no {LEDGER_FILE})",
}


def run_spend(run: RunRecord) -> dict[str, Any]:
    """Tokens and cost billed for a run, and where they were counted (``source``):

    * ``usage.jsonl``: every call in the run's ledgers, failed tasks and the judge's calls (``judge_usage.jsonl``)
      included, with the agent's and the judge's cost apart. A ledger with no call (a replay calls no model) is
      0 tokens and $0, whatever the summary says the replayed run cost;
    * ``replay``: no ledger, and the summary says the run was a replay: nothing billed either;
    * ``recorded``: an older run without a ledger: the tasks' recorded usage and the summary's cost.
    """
    bills = read_bills(run.path)
    retries = sum(b.retries for b in bills.values())
    fallbacks = sum(b.fallbacks for b in bills.values())
    layout = RunLayout(run.path)
    if bills or layout.ledger.is_file() or layout.judge_ledger.is_file():
        billed = RunBill.read(run.path)
        return {
            "tokens": billed.tokens,
            "cost_usd": billed.cost_usd,
            "agent_cost_usd": billed.to_dict()["agent_usd"],
            "judge_cost_usd": billed.to_dict()["judge_usd"],
            "estimated": any(b.estimated for b in bills.values()),
            "retries": retries,
            "fallbacks": fallbacks,
            "source": LEDGER_FILE,
        }
    summary = summary_figures(run)
    cost = summary.cost if isinstance(summary.cost, CostBlock) else CostBlock()
    if cost.replayed or is_replay(run):
        return {"tokens": 0, "cost_usd": 0.0, "estimated": False, "retries": 0, "fallbacks": 0, "source": "replay"}
    usage = summary.usage or {}
    return {
        "tokens": int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0),
        "cost_usd": cost.total_usd,
        "estimated": bool(usage.get("estimated")),
        "retries": None,
        "fallbacks": None,
        "source": "recorded",
    }


# ----- summary.json extras: tool servers that were not offered, accuracy by category ------------------------
def unavailable_tools(summary: RunSummary) -> dict[str, Any] | None:
    """``summary.json`` → ``tools.unavailable``: ``{"known": True, "servers": {name: why}}`` when some server
    was disabled or failed to start, ``{"known": False, "servers": {}}`` when the run recorded null (not known:
    the parent of several worker processes does not see their servers), None when there is nothing to show
    (every server was offered, or the summary is older than the field)."""
    tools = summary.tools
    if not isinstance(tools, ToolsBlock) or not tools.unavailable_recorded:
        return None
    servers = tools.unavailable
    if servers is None:
        return {"known": False, "servers": {}}
    if not isinstance(servers, dict) or not servers:
        return None
    return {"known": True, "servers": {str(k): str(v) for k, v in sorted(servers.items())}}


def breakdown_rows(summary: RunSummary) -> dict[str, list[dict[str, Any]]]:
    """``summary.json`` → ``breakdown`` (accuracy of a judged benchmark per category: topic, answer type...)
    as ``{field: [{value, tasks, scored, correct, accuracy}, ...]}`` (accuracy over the scored tasks, None when
    none was); fields with no group are left out."""
    value = summary.breakdown
    out: dict[str, list[dict[str, Any]]] = {}
    if not isinstance(value, dict):
        return out
    for name, groups in value.items():
        if not isinstance(groups, dict):
            continue
        rows = []
        for group, figures in groups.items():
            if not isinstance(figures, dict | LevelTally):
                continue
            tally = LevelTally.coerce(figures)
            tasks, correct = tally.tasks, tally.correct
            # Written before unscored tasks were counted: every task was scored.
            scored = tally.scored_count
            accuracy = tally.accuracy
            if accuracy is None and isinstance(scored, int) and isinstance(correct, int) and scored:
                accuracy = round(correct / scored, 4)  # a summary that left it out
            row = {"value": str(group), "tasks": tasks, "scored": scored, "correct": correct, "accuracy": accuracy}
            rows.append(row)
        if rows:
            out[str(name)] = rows
    return out
