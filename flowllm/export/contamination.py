"""The contamination audit: the tasks whose answer reached the agent from outside their own files.

A saved run is read through its traces (flowllm/export/trace.py), sub-agents' conversations included. A tool
result counts as *outside* when it came from the web (``web_search``, ``read_url``, ``find_in_url``), or from the
sandbox running code that names an http(s) URL (a file it fetched); so does a memory recalled into the prompt
(``memory.enabled``: an earlier task's or run's notes, which hold their answers). A task is flagged when its
normalised ground truth (case, punctuation and digit-group commas aside, as whole words) or one of
``tools.web.answer_patterns`` (regular expressions) occurs in such a result: the task's own attachments and what
the agent computed from them are never outside. A flag is a lead to check (``flowllm inspect audit RUN`` shows
the excerpt), not proof: a short answer may also be an ordinary fact on a page the task meant the agent to read.

The guard's blocks (flowllm/tools/web/guard.py) are counted from the same results. ``summary.json →
contamination`` (``ContaminationBlock``) holds both, and the accuracy over all scored tasks and over those not
flagged, each with its interval. Runs made before the audit existed are audited the same way.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowllm.export.trace import TaskTrace, ToolCall, Turn, read_run_traces
from flowllm.rundir.results import ContaminationBlock, RunSummary, TaskResult
from flowllm.scoring.stats import StatsSettings, TaskScore, estimate, format_estimate
from flowllm.scoring.tally import known_score
from flowllm.tools.web.guard import RECORD_KEY, Block

WEB_TOOLS = frozenset({"web_search", "read_url", "find_in_url"})
MEMORY = "recall_memory"  # a flag's tool when the answer came back in a recalled memory
SANDBOX_TOOLS = frozenset({"run_python"})
_URL = re.compile(r"https?://[^\s'\"<>)\]]+")
_RESULT_URL = re.compile(r"URL: (\S+)")
EXCERPT_CHARS = 100


@dataclass(frozen=True)
class Flag:
    """Where a task's answer came back from outside: the conversation, turn, tool, URL and the text around it."""

    task_id: str
    epoch: int
    agent: str
    turn: int
    tool: str
    url: str | None
    excerpt: str
    matched: str  # "ground truth" or "pattern <regex>"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Audit:
    flags: list[Flag] = field(default_factory=list)
    blocks: list[tuple[str, str, Block]] = field(default_factory=list)  # task id, tool, block
    scores: dict[str, float] = field(default_factory=dict)  # task id -> score, the scored tasks
    patterns: list[str] = field(default_factory=list)

    @property
    def flagged_tasks(self) -> list[str]:
        return sorted({f.task_id for f in self.flags})

    def block(self, settings: StatsSettings | None = None) -> ContaminationBlock:
        """``summary.json → contamination``."""
        flagged = set(self.flagged_tasks)
        scored = [TaskScore(task_id, score) for task_id, score in sorted(self.scores.items())]
        clean = [t for t in scored if t.task_id not in flagged]
        return ContaminationBlock(
            blocked=len(self.blocks),
            blocked_by_tool=dict(sorted(Counter(tool for _, tool, _ in self.blocks).items())),
            blocked_tasks=sorted({task_id for task_id, _, _ in self.blocks}),
            flagged=len(flagged),
            flagged_tasks=sorted(flagged),
            patterns=list(self.patterns),
            accuracy=estimate(scored, settings=settings).to_dict(),
            accuracy_excluding_flagged=estimate(clean, settings=settings).to_dict(),
        )


def normalised(text: str) -> str:
    """Unicode compatibility forms folded and digit groups joined (``48,213`` is ``48213``)."""
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", unicodedata.normalize("NFKC", text))


def answer_regex(answer: str | None) -> re.Pattern[str] | None:
    """The ground truth as whole words in order, whatever the case, punctuation or spacing between them."""
    words = re.findall(r"\w+", normalised(answer or ""))
    if not words:
        return None
    return re.compile(r"(?<!\w)" + r"[\W_]+".join(map(re.escape, words)) + r"(?!\w)", re.IGNORECASE)


def is_outside(call: ToolCall) -> bool:
    """Whether a tool result came from outside the task's own files."""
    if call.name in WEB_TOOLS:
        return True
    return call.name in SANDBOX_TOOLS and bool(_URL.search(str(call.arguments or call.arguments_text or "")))


def _url(call: ToolCall, text: str, position: int) -> str | None:
    args = call.arguments or {}
    if isinstance(args.get("url"), str):
        return str(args["url"])
    before = _RESULT_URL.findall(text[:position])  # a search result: the URL of the entry the match is in
    if before:
        return str(before[-1])
    found = _URL.search(str(args or call.arguments_text or ""))
    return found.group(0) if found else None


def _excerpt(text: str, start: int, end: int) -> str:
    lo, hi = max(0, start - EXCERPT_CHARS), min(len(text), end + EXCERPT_CHARS)
    body = " ".join(text[lo:hi].split())
    return f"{'...' if lo else ''}{body}{'...' if hi < len(text) else ''}"


def _blocks(call: ToolCall) -> list[Block]:
    record = call.structured.get(RECORD_KEY) if isinstance(call.structured, Mapping) else None
    if isinstance(record, Mapping) and isinstance(record.get("blocked"), list):
        return [Block(str(b.get("url")), str(b.get("rule"))) for b in record["blocked"] if isinstance(b, Mapping)]
    return []


def _first_hit(text: str, needles: Sequence[tuple[re.Pattern[str] | None, str]]) -> tuple[re.Match[str], str] | None:
    """The first needle found in ``text`` (normalised), and what it is."""
    for needle, what in needles:
        hit = needle.search(text) if needle is not None else None
        if hit is not None:
            return hit, what
    return None


def _outside_texts(turn: Turn) -> Iterator[tuple[str, str, ToolCall | None]]:
    """What reached a turn from outside the task, normalised: memories recalled into its prompt (no URL: the
    excerpt says which task's note it was), then tool results from outside, each with its call."""
    for memory in turn.recalled:
        yield MEMORY, normalised(str(memory.get("text") or "")), None
    for call in turn.tool_calls:
        if call.result and is_outside(call):
            yield call.name, normalised(call.result), call


def audit_trace(trace: TaskTrace, patterns: Sequence[re.Pattern[str]], into: Audit) -> None:
    """The flags and blocks of one task (one epoch of it)."""
    truth = trace.saved.ground_truth or (trace.task_result.ground_truth if trace.task_result else None)
    needles = [(answer_regex(truth), "ground truth"), *((p, f"pattern {p.pattern}") for p in patterns)]
    for conv in trace.all_conversations():
        for turn in conv.turns:
            for call in turn.tool_calls:
                into.blocks.extend((trace.task_id, call.name, b) for b in _blocks(call))
            for tool, text, source in _outside_texts(turn):
                found = _first_hit(text, needles)
                if found is None:
                    continue
                hit, what = found
                url = _url(source, text, hit.start()) if source is not None else None
                excerpt = _excerpt(text, hit.start(), hit.end())
                into.flags.append(Flag(trace.task_id, trace.epoch, conv.agent, turn.number, tool, url, excerpt, what))


def _score(result: TaskResult) -> float | None:
    return known_score(
        status=result.status,
        replay=result.replay if isinstance(result.replay, Mapping) else None,
        correct=result.correct if isinstance(result.correct, bool) else None,
        score_error=result.score_error,
        epochs=int(result.epochs or 1),
        score=result.score,
    )


def audit_run(run_dir: Path, patterns: Iterable[str] = ()) -> Audit:
    """The audit of a saved run (any flowllm version's)."""
    listed = [str(p) for p in patterns]
    compiled = [re.compile(p, re.IGNORECASE) for p in listed]
    audit = Audit(patterns=listed)
    for trace in read_run_traces(run_dir):
        audit_trace(trace, compiled, audit)
        task = trace.task_result
        score = _score(task) if task is not None else None
        if score is not None:
            audit.scores[trace.task_id] = score
    return audit


def headline(block: ContaminationBlock) -> str:
    """``accuracy 61.0% (all) / 58.2% (excluding 5 flagged tasks)``."""

    def pct(est: Mapping[str, Any]) -> str:
        mean = est.get("mean")
        return "not known" if mean is None else f"{100 * mean:.1f}%"

    return (
        f"accuracy {pct(block.accuracy)} (all) / {pct(block.accuracy_excluding_flagged)} "
        f"(excluding {block.flagged} flagged task{'' if block.flagged == 1 else 's'})"
    )


def contamination_rows(summary: RunSummary | Mapping[str, Any]) -> list[tuple[str, str]]:
    """The console's rows for ``summary.json → contamination`` (none for a summary written before it)."""
    block = RunSummary.coerce(summary).contamination
    if block is None:
        return []
    if not block.flagged and not block.blocked:
        return [("contamination", "no task flagged, no answer source blocked")]
    by_tool = ", ".join(f"{tool} {n}" for tool, n in block.blocked_by_tool.items())
    rows = [
        ("contamination", headline(block)),
        ("  all", format_estimate(block.accuracy)),
        ("  not flagged", format_estimate(block.accuracy_excluding_flagged)),
        ("  answer sources blocked", f"{block.blocked} ({by_tool})" if block.blocked else "0"),
    ]
    if block.flagged_tasks:
        shown = ", ".join(block.flagged_tasks[:5]) + (" ..." if len(block.flagged_tasks) > 5 else "")
        rows.append(("  flagged tasks", f"{shown} (flowllm inspect audit RUN)"))
    return rows
