"""The tables printed at the end of a run (rich): one row per task, then the run's summary."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flowllm.core.types import Usage
from flowllm.export.contamination import contamination_rows
from flowllm.run.budget_report import budget_rows
from flowllm.run.infra import infra_row
from flowllm.run.replay_audit import effect_not_known
from flowllm.run.stats import stats_rows
from flowllm.rundir.layout import ATTEMPTS_DIR, EPOCHS_DIR, NODE_RE, OUTPUT_FILE, TASKS_DIR, TURN_RE, RunLayout
from flowllm.rundir.results import CostBlock, RunSummary
from flowllm.scoring.tally import UNFINISHED_STATUS, accuracy_text
from flowllm.spend.fork_accounting import fork_rows
from flowllm.spend.task_usage import TaskBill
from flowllm.tools.client.connection import RESTART_MESSAGE

# Beyond this many tasks the per-task table shows only the ones worth a look (wrong or failed).
MAX_TASK_ROWS = 40
# A cell wraps; past this many characters it ends with an ellipsis (the full text is in result.json).
MAX_CELL_CHARS = 300


def make_console() -> Console:
    """The console for end-of-run tables; piped to a file or a log it is wide enough not to wrap every cell."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)
    return console


def format_usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def cost_text(cost: CostBlock | Mapping[str, Any]) -> str:
    """``summary.json``'s ``cost`` in one line: what this run folder was billed, split agent / judge (a replay:
    the saved run's cost beside it, named so)."""
    cost = cost if isinstance(cost, CostBlock) else CostBlock.from_dict(dict(cost))
    if cost.total_usd is None:
        return f"- ({cost.note or 'a billed model has no price'})"
    estimated = " (estimated token counts)" if cost.estimated_tokens else ""
    if cost.agent_usd is None and (cost.loaded_keys is None or "agent_usd" not in cost.loaded_keys):
        # a summary of older runs: the finished tasks' tokens at the model's price
        note = f": {cost.note}" if cost.replayed and cost.note else ""
        return f"{format_usd(cost.total_usd)} ({cost.model}){estimated}{note}"
    split = f"agent {format_usd(cost.agent_usd)}"
    if cost.judge_usd:
        split += f", judge {format_usd(cost.judge_usd)}"
    text = f"{format_usd(cost.total_usd)} billed in this run folder ({split}; {cost.model}){estimated}"
    if cost.replayed:
        text += f"; the saved run paid {format_usd(cost.saved_run_usd)} for these answers"
    return text


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


# Error texts start with the exception's class ("ProviderCallError: local: ..."): the class says nothing the
# status column does not, and it ate a third of the column.
_ERROR_PREFIX = re.compile(r"^(?:[A-Z]\w*(?:Error|Exception)): ")


def short_error(error: str | None) -> str:
    return _ERROR_PREFIX.sub("", (error or "").strip(), count=1) or "failed"


def format_tokens(count: int | None, estimated: bool = False) -> str:
    if count is None:
        return "-"
    return f"~{count:,}" if estimated else f"{count:,}"


def _verdict_cell(outcome: Any) -> str:
    """The table's ``correct`` cell: a task the run's budget stopped is unfinished, as the summary counts it (not
    wrong); one with no verdict (no ground truth, a diverged replay) unscored."""
    if outcome.status == UNFINISHED_STATUS:
        return "[yellow]unfinished"
    if outcome.correct is None:
        return "[yellow]unscored"
    return "[green]yes" if outcome.correct else "[red]no"


def task_table(outcomes: Sequence[Any], bills: Mapping[str, TaskBill] | None = None) -> Table:
    shown = list(outcomes)
    title = "tasks"
    if len(shown) > MAX_TASK_ROWS:
        shown = [o for o in shown if o.correct is not True][:MAX_TASK_ROWS]
        title = f"tasks not solved ({len(shown)} shown of {sum(1 for o in outcomes if o.correct is not True)})"
    bills = bills or {}
    table = Table(title=title, show_lines=False)
    table.add_column("task", overflow="fold")
    for column in ("level", "status"):
        table.add_column(column)
    # Answers and errors wrap inside their column (up to a few lines) instead of being cut at a fixed width.
    table.add_column("answer", overflow="fold", ratio=3, min_width=20)
    table.add_column("expected", overflow="fold", ratio=1, min_width=8)
    for column in ("correct", "turns", "tool calls", "tokens", "cost"):
        table.add_column(column, justify="right" if column in ("turns", "tool calls", "tokens", "cost") else "left")
    for o in shown:
        mark = _verdict_cell(o)
        halt = o.halt_detail
        if o.answer is not None:
            answer = escape(str(o.answer)[:MAX_CELL_CHARS])
        elif halt:  # ended by a limit or the budget before giving an answer
            answer = f"[yellow]{escape(halt[:MAX_CELL_CHARS])}"
        else:
            answer = f"[red]{escape(short_error(o.error)[:MAX_CELL_CHARS])}"
        attempts = f" ({o.attempts} tries)" if getattr(o, "attempts", 1) > 1 else ""
        bill = bills.get(o.task_id)
        # Billed tokens come from the ledger (failed tasks' calls were paid for too); the result's usage otherwise.
        tokens = format_tokens(bill.total_tokens, bill.estimated) if bill else format_tokens(o.usage.total_tokens)
        cost = format_usd(bill.cost_usd) if bill else "-"
        table.add_row(
            o.task_id,
            str(o.level),
            o.status + (f" ({o.limit})" if getattr(o, "limit", None) else "") + attempts,
            answer,
            "-" if o.ground_truth is None else escape(str(o.ground_truth)[:MAX_CELL_CHARS]),
            mark,
            str(o.turns),
            str(o.tool_calls),
            tokens,
            cost,
        )
    return table


def headline_accuracy(summary: RunSummary | Mapping[str, Any]) -> str:
    """``80.0% (8/10 scored)``, then what it leaves out: unscored tasks (no ground truth) and unfinished ones.
    Counted as every breakdown is (flowllm/scoring/tally.py); a summary written before ``scored`` existed
    counted every task."""
    summary = RunSummary.coerce(summary)
    text = accuracy_text(summary.correct, summary.scored_count, summary.accuracy)
    notes = _unscored_notes(summary, summary.unscored or 0)
    if summary.unfinished and summary.scored is not None:
        notes.append(f"{summary.unfinished} unfinished, not counted")
    return f"{text}; {'; '.join(notes)}" if notes else text


def _unscored_notes(summary: RunSummary, unscored: int) -> list[str]:
    """Why ``unscored`` finished tasks have no verdict: an answer that could not be scored (the judge failed), or no
    ground truth to score against."""
    unscored = max(unscored, 0)
    errors = min(summary.scoring_errors or 0, unscored)
    notes = []
    if errors:
        notes.append(f"{errors} unscored: the answer could not be scored (a rerun into this folder scores it again)")
    if unscored > errors:
        notes.append(f"{unscored - errors} unscored: no ground truth")
    return notes


def accuracy_rows(summary: RunSummary | Mapping[str, Any]) -> list[tuple[str, str]]:
    """The accuracy line, and for a replay the exact/forked/diverged counts it is scored on (replay_audit.py)."""
    summary = RunSummary.coerce(summary)
    replay = summary.replay
    if replay is None:
        return [("accuracy", headline_accuracy(summary))]
    # A replay is scored on the tasks whose every reply answered the request it was given (exact, and a fork's
    # forked tasks); a diverged task's replies answered another conversation: its score is not known.
    exact, forked = replay.exact, replay.forked
    scored = exact if replay.scored is None else replay.scored
    correct = replay.exact_correct if replay.scored_correct is None else replay.scored_correct
    # Over those of them with a verdict: a task with no ground truth replays, but has no score to count.
    judged = scored if summary.scored is None else summary.scored
    what = "exact + forked" if forked else "exact replays"
    shown = None
    if summary.accuracy is not None and judged:
        shown = f"{correct / judged:.1%} ({correct}/{judged} scored: {what})"
        notes = _unscored_notes(summary, (summary.unscored or 0) - replay.unscored)  # less those that did not replay
        shown += "".join(f"; {note}" for note in notes)
    counts = f"{exact} exact, "
    if forked or summary.fork is not None:
        counts += f"{forked} forked, "
    counts += (
        f"{replay.diverged} diverged, {replay.missing} missing, "
        f"{replay.unverified} unverified ({replay.unscored} unscored)"
    )
    headline = shown or "unknown: no task was scored (none replayed exactly)"
    if summary.unfinished and summary.scored is not None:  # as a run's headline says it
        headline += f"; {summary.unfinished} unfinished, not counted"
    not_known = effect_not_known(replay.unscored, scored)
    if not_known:  # said with the figure: it is not the change's effect on the whole run
        headline += f"; {not_known}"
    return [
        ("accuracy", headline),
        ("replay", counts),
        *fork_rows(summary.fork),
    ]


def _token_rows(summary: RunSummary) -> list[tuple[str, str]]:
    usage = Usage.from_dict(summary.usage)
    uncached = summary.tokens.get("input_uncached", usage.input_tokens)
    # Estimated counts (a server that reported none) are flagged on every token row, priced or not.
    estimated = " [yellow](estimated)[/yellow]" if usage.estimated else ""
    rows = [
        ("tokens in (uncached) / out", f"{usage.input_tokens:,} ({uncached:,}) / {usage.output_tokens:,}{estimated}")
    ]
    billed_block = summary.providers.get("usage")  # the ledger's, every call: flowllm/providers/ledger.py
    billed = Usage.from_dict(billed_block)
    if billed_block and billed.input_tokens + billed.output_tokens != usage.input_tokens + usage.output_tokens:
        flag = " [yellow](estimated)[/yellow]" if billed.estimated else ""
        rows.append(
            (
                "billed tokens in / out",
                f"{billed.input_tokens:,} / {billed.output_tokens:,} (every call, failed tasks included){flag}",
            )
        )
    rows.append(("cache read / write", f"{usage.cache_read_tokens:,} / {usage.cache_write_tokens:,}"))
    if usage.reasoning_tokens:
        rows.append(("reasoning (part of out)", f"{usage.reasoning_tokens:,}"))
    return rows


def summary_rows(summary: RunSummary | Mapping[str, Any], run_dir: Path | None = None) -> list[tuple[str, str]]:
    summary = RunSummary.coerce(summary)
    rows = accuracy_rows(summary)
    for level, data in summary.by_level.items():
        name = "no level" if level == "None" else f"level {level}"
        rows.append((f"  {name}", accuracy_text(data.correct, data.scored_count, data.accuracy)))
    rows.extend(stats_rows(summary))
    rows.extend(contamination_rows(summary))
    if summary.attempts > 1:
        rows.append(("attempts (retry until correct)", f"k={summary.attempts}, {summary.attempts_used} run"))
    finished = f"{summary.completed} / {summary.failed}"
    if summary.unfinished:
        finished += f" ({summary.unfinished} unfinished)"
    rows.append(("completed / failed", finished))
    rows.extend(budget_rows(summary))
    if summary.resumed:
        rows.append(("resumed", f"{plural(summary.resumed, 'task')} already completed by an earlier run"))
    made = summary.tool_calls + summary.bad_tool_calls if summary.tool_calls_made is None else summary.tool_calls_made
    parsed = summary.tool_calls if summary.tool_calls_parsed is None else summary.tool_calls_parsed
    rate = f" ({summary.parse_rate:.1%})" if summary.parse_rate is not None else ""
    rows.append(("tool calls made / parsed", f"{made} / {parsed}{rate}"))
    rows.append(("repairs by stage", ", ".join(f"{k}: {v}" for k, v in summary.repairs.items()) or "-"))
    rows.extend(_token_rows(summary))
    if summary.cost is not None:
        rows.append(("cost", cost_text(summary.cost)))
    if summary.acted is not None:
        rows.append(("what acted", acted_row(summary.acted)))
    infra = infra_row(summary.infra_tool_failures)
    if infra is not None:
        rows.append(("[yellow]tool calls failed by infrastructure", f"[yellow]{infra}"))
    rows.append(("wall time", f"{summary.wall_seconds:.1f}s"))
    if run_dir is not None:
        rows.append(("run directory", str(run_dir)))
    if summary.interrupted:
        rows.insert(0, ("[red]interrupted", "[red]yes: rerun with the same hydra.run.dir to resume"))
    return rows


def what_acted(
    providers: Mapping[str, Any],
    outcomes: Sequence[Any],
    run_dir: Path | None = None,
    snapshot: str = "all",
) -> dict[str, Any]:
    """The resilience and agent features that did something in this run.

    Retries, fallbacks, the breaker and other agents' calls come from the ledger's summary (``providers``),
    repairs and pass@k from the results. With ``run_dir``: trimming, compaction and memory recall from the
    node records (``None`` when ``snapshot`` is not ``all``: the records of completed tasks were not kept, so
    the count would be partial), and tool-server restarts from the run's log.
    """
    by_agent = providers.get("by_agent") or {}
    breaker = providers.get("breaker_transitions") or {}
    acted: dict[str, Any] = {
        "retries": int(providers.get("retries") or 0),
        "fallbacks": int(providers.get("fallbacks_taken") or 0),
        "breaker_opened": sum(1 for events in breaker.values() for e in events if e.get("to") == "open"),
        "failed_calls": int(providers.get("calls_failed") or 0),
        # model calls made for other agents than the main one: sub-agents, the compaction summariser
        "other_agent_calls": {
            name: int(tally.get("attempts") or 0) for name, tally in sorted(by_agent.items()) if name != "main"
        },
        "repairs": sum(sum((getattr(o, "repairs", None) or {}).values()) for o in outcomes),
        "pass_at_k_retries": sum(max(0, getattr(o, "attempts", 1) - 1) for o in outcomes),
        "trimmed_turns": None,
        "dropped_turns": None,
        "compactions": None,
        "memories_recalled": None,
        "tool_server_restarts": None,
    }
    if run_dir is not None:
        if snapshot == "all":
            acted.update(context_acted(run_dir / TASKS_DIR))
        acted["tool_server_restarts"] = tool_server_restarts(RunLayout(run_dir).log)
    return acted


# What a tool server's restart logs (flowllm/tools/client/connection.py), as a pattern naming the server.
_RESTART_LINE = re.compile(re.escape(RESTART_MESSAGE).replace("%s", "(?P<server>.+?)").replace("%d", r"\d+") + r"\s*$")
# The node outputs the count reads: trim_history's request view and budget decision, compact_history's decision,
# recall_memory's memories. Folder names are <NN>_<node> (flowllm/rundir/layout.py).
_CONTEXT_NODES = ("trim_history", "compact_history", "recall_memory")


def tool_server_restarts(log_path: Path) -> dict[str, int] | None:
    """Restarts per tool server, from the run's log (every session of the run directory); None without a log."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    counts: dict[str, int] = {}
    for line in text.splitlines():
        match = _RESTART_LINE.search(line)
        if match:
            counts[match["server"]] = counts.get(match["server"], 0) + 1
    return dict(sorted(counts.items()))


def _node_outputs(conversation: Path, depth: int = 0, records: bool = True) -> Iterator[tuple[str, Path]]:
    """(node name, output.json) of the context nodes of a conversation folder: its turns, and the sub-agents' (and
    other nested) conversations under its turns; of a records folder (``records``: a task's, or an epoch's) also
    its epochs and earlier pass@k attempts; never its workspace."""
    try:
        children = sorted(p for p in conversation.iterdir() if p.is_dir())
    except OSError:
        return
    for child in children:
        if TURN_RE.match(child.name):
            for node_dir in sorted(p for p in child.iterdir() if p.is_dir()):
                match = NODE_RE.match(node_dir.name)
                name = match.group(2) if match else node_dir.name
                if name in _CONTEXT_NODES:
                    yield name, node_dir / OUTPUT_FILE
                elif not match and depth < 8:  # subagents/<name>-<id>/, a compaction call's folder
                    for nested in (node_dir, *(p for p in node_dir.iterdir() if p.is_dir())):
                        yield from _node_outputs(nested, depth + 1, records=False)
        elif records and child.name in (ATTEMPTS_DIR, EPOCHS_DIR):
            for run in sorted(p for p in child.iterdir() if p.is_dir()):  # an epoch has attempts of its own
                yield from _node_outputs(run, depth + 1, records=child.name == EPOCHS_DIR)


def _trimmed(output: Mapping[str, Any]) -> tuple[bool, int]:
    """Whether trim_history changed the request (a tool result blanked, a turn dropped), and turns dropped."""
    budget = output.get("context_budget") or {}
    dropped = int(budget.get("dropped_turns") or 0)
    blanked = bool(budget.get("blanked")) or any(
        isinstance(m, dict) and (m.get("meta") or {}).get("trimmed") for m in output.get("request_messages") or []
    )
    return blanked or dropped > 0, dropped


def context_acted(tasks_dir: Path) -> dict[str, int]:
    """Turns whose request trim_history trimmed (and whole turns it dropped), compactions, and memories recalled
    (each memory once per conversation, though recall_memory adds it every turn), from the node records."""
    trimmed = dropped = compactions = recalled = 0
    try:
        task_dirs = sorted(p for p in tasks_dir.iterdir() if p.is_dir())
    except OSError:
        task_dirs = []
    for task_dir in task_dirs:
        seen: set[tuple[str, Any]] = set()
        for name, path in _node_outputs(task_dir):
            try:
                data = path.read_bytes()
            except OSError:
                continue
            # Most trim records of a run without a budget change nothing: skip parsing a whole history for them.
            if name == "trim_history" and b"trimmed" not in data and b"context_budget" not in data:
                continue
            try:
                output = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue  # a cut record: inspect says so; the summary counts what it can read
            if not isinstance(output, dict):
                continue
            if name == "trim_history":
                acted, turns = _trimmed(output)
                trimmed += int(acted)
                dropped += turns
            elif name == "compact_history":
                compactions += int(bool((output.get("compaction") or {}).get("compacted")))
            else:
                conversation = str(path.parent.parent.parent)
                for memory in output.get("recalled") or []:
                    if isinstance(memory, dict):
                        seen.add((conversation, memory.get("id", memory.get("text"))))
        recalled += len(seen)
    return {
        "trimmed_turns": trimmed,
        "dropped_turns": dropped,
        "compactions": compactions,
        "memories_recalled": recalled,
    }


def acted_row(acted: Mapping[str, Any]) -> str:
    parts = []
    for key, word in (("retries", "retry"), ("fallbacks", "fallback"), ("breaker_opened", "breaker opening")):
        if acted.get(key):
            parts.append(plural(int(acted[key]), word).replace("retrys", "retries"))
    for agent, calls in (acted.get("other_agent_calls") or {}).items():
        parts.append(f"{plural(int(calls), 'call')} by {agent}")
    if acted.get("pass_at_k_retries"):
        parts.append(f"{plural(int(acted['pass_at_k_retries']), 'extra attempt')} (pass@k)")
    if acted.get("trimmed_turns"):
        dropped = int(acted.get("dropped_turns") or 0)
        detail = f" ({plural(dropped, 'old turn')} dropped)" if dropped else ""
        parts.append(f"{plural(int(acted['trimmed_turns']), 'request')} trimmed{detail}")
    if acted.get("compactions"):
        parts.append(plural(int(acted["compactions"]), "compaction"))
    if acted.get("memories_recalled"):
        parts.append(f"{plural(int(acted['memories_recalled']), 'memory')} recalled".replace("memorys", "memories"))
    restarts = acted.get("tool_server_restarts") or {}
    if restarts:
        servers = ", ".join(f"{name}: {count}" for name, count in restarts.items())
        parts.append(f"{plural(sum(restarts.values()), 'tool-server restart')} ({servers})")
    return ", ".join(parts) or "nothing (no retries, fallbacks, other agents, trimming, compaction, memory or restarts)"


def print_summary(
    summary: RunSummary | Mapping[str, Any],
    outcomes: Sequence[Any],
    run_dir: Path,
    console: Console | None = None,
    bills: Mapping[str, TaskBill] | None = None,
) -> None:
    console = console or make_console()
    if outcomes:
        console.print(task_table(outcomes, bills))
    totals = Table(title="summary", show_header=False)
    totals.add_column("what")
    totals.add_column("value")
    for row in summary_rows(summary, run_dir):
        totals.add_row(*row)
    console.print(totals)
