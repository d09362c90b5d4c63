"""The run folder's result files as typed records: ``summary.json`` (``RunSummary``), each task's and epoch's
``result.json`` (``TaskResult``) and every line of ``usage.jsonl`` (``LedgerLine``).

Writers build a record and write ``to_dict()``; readers call ``from_dict`` and use attributes, never string
keys. New files carry ``format_version`` (``FORMAT_VERSION``); a file written before it existed reads as
version 0 and round-trips without one. Missing keys take their defaults (None where "absent" must be told
apart from a value), unknown keys are kept in ``extra`` (record_base.py). ``schema/`` holds the JSON Schema
``python -m flowllm.rundir.schema_gen`` generates from these classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from flowllm.errors import ErrorKind
from flowllm.rundir.record_base import KEY, OPTIONAL, Record

__all__ = [
    "FORMAT_VERSION",
    "BudgetBlock",
    "ContaminationBlock",
    "CostBlock",
    "ForkBlock",
    "InfraFailures",
    "LedgerLine",
    "LevelTally",
    "ReplayBlock",
    "RunSummary",
    "StatsBlock",
    "TaskResult",
    "ToolsBlock",
    "Versioned",
    "result_problems",
]

# 1: the first versioned layout (the keys below). Files without the key are older (version 0).
FORMAT_VERSION = 1
_LIMITED = ("limit", "budget")  # statuses whose result says which limit and what reached it


@dataclass(kw_only=True)
class Versioned(Record):
    """A file's record: ``format_version`` says which layout wrote it (0: before there was one)."""

    format_version: int = FORMAT_VERSION
    REQUIRED: ClassVar[tuple[str, ...]] = ()  # keys every file of the record has (the schema's ``required``)

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        record = super().from_dict(data)
        if "format_version" not in data:
            record.format_version = 0
        return record

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.loaded_keys is not None and "format_version" not in self.loaded_keys:
            out.pop("format_version", None)  # an older file stays as it was written
        return out


# ----- result.json ---------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class TaskResult(Versioned):
    """``tasks/<id>/result.json`` (and ``epochs/<n>/result.json``): one task's outcome (flowllm/run/outcome.py)."""

    REQUIRED = ("task_id", "status")

    task_id: str = ""
    status: str = ""
    answer: str | None = None
    ground_truth: str | None = None
    correct: bool | None = None  # None: not scored (no ground truth; a replay that diverged)
    turns: int = 0
    usage: dict[str, Any] = field(default_factory=dict)  # core.types.Usage.to_dict()
    error: str | None = None
    level: int | None = None
    stop: str | None = None
    tool_calls: int = 0
    bad_tool_calls: int = 0
    failed_tool_calls: int = 0
    infra_tool_failures: int = 0
    infra_tool_failure_causes: dict[str, int] = field(default_factory=dict)
    repairs: dict[str, int] = field(default_factory=dict)
    attempts: int = 1
    attempt_log: list[dict[str, Any]] = field(default_factory=list)
    # provider=replay: whether the task replayed exactly
    replay: dict[str, Any] | None = field(default=None, metadata=OPTIONAL)
    # experiment.epochs > 1: the four fields below are written with it
    epochs: int = field(default=1, metadata=OPTIONAL)
    epoch_reducer: str | None = field(default=None, metadata=OPTIONAL)
    epoch_log: list[dict[str, Any]] = field(default_factory=list, metadata=OPTIONAL)
    score: float | None = field(default=None, metadata=OPTIONAL)
    # status limit or budget: the three fields below are written with it
    limit: str | None = field(default=None, metadata=OPTIONAL)
    halt_detail: str | None = field(default=None, metadata=OPTIONAL)
    scored: bool = field(default=True, metadata=OPTIONAL)
    score_error: str | None = None
    verdict: str | None = None
    judge: dict[str, Any] | None = None
    categories: dict[str, Any] = field(default_factory=dict)
    # Older files: the task's wall time, before it moved to timing.json.
    wall_seconds: float | None = field(default=None, metadata=OPTIONAL)
    # A rerun resumed the task from its saved turns (flowllm/run/resume.py): the model calls they answered (not
    # sent, not paid again), and the first resumed node whose output differed from the saved one; written when set.
    resumed_turns: int = field(default=0, metadata=OPTIONAL)
    resume_divergence: dict[str, Any] | None = field(default=None, metadata=OPTIONAL)

    def omitted_keys(self) -> set[str]:
        omitted = {"replay", "wall_seconds"} if self.replay is None else {"wall_seconds"}
        if not self.resumed_turns:
            omitted.add("resumed_turns")
        if self.resume_divergence is None:
            omitted.add("resume_divergence")
        if self.epochs <= 1:
            omitted |= {"epochs", "epoch_reducer", "epoch_log", "score"}
        if self.status not in _LIMITED:
            omitted |= {"limit", "halt_detail", "scored"}
        return omitted


# The keys a result.json must have and the JSON types of the checked ones (``result_problems``).
_RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "task_id": (str,),
    "status": (str,),
    "correct": (bool,),  # or null: unscored
    "turns": (int,),
    "tool_calls": (int,),
    "bad_tool_calls": (int,),
    "failed_tool_calls": (int,),
    "attempts": (int,),
    "wall_seconds": (int, float),
    "usage": (dict,),
    "repairs": (dict,),
    "attempt_log": (list,),
}
_RESULT_OPTIONAL_TYPES: dict[str, tuple[type, ...]] = {
    "answer": (str,),
    "ground_truth": (str,),
    "error": (str,),
    "level": (int,),
    "stop": (str,),
    "limit": (str,),
    "halt_detail": (str,),
}
_RESULT_MAY_LACK = frozenset({"attempts", "attempt_log", "repairs", "wall_seconds"})  # older files lack them
_RESULT_NULLABLE = frozenset({"correct"})  # always present, null when not known


def result_problems(data: Any) -> list[str]:
    """What makes ``data`` not shaped as a ``result.json`` (empty: it is): a missing key or a value of the wrong
    JSON type. The rules of its values (statuses, counts) are flowllm/run/outcome.py's ``outcome_problems``."""
    if not isinstance(data, dict):
        return [f"expected a JSON object, got {type(data).__name__}"]
    problems = []
    for name, types in (*_RESULT_TYPES.items(), *_RESULT_OPTIONAL_TYPES.items()):
        if name not in data:
            if name in _RESULT_TYPES and name not in _RESULT_MAY_LACK:
                problems.append(f"{name} is missing")
            continue
        value = data[name]
        if value is None and (name in _RESULT_OPTIONAL_TYPES or name in _RESULT_NULLABLE):
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            problems.append(f"{name}: expected {' or '.join(t.__name__ for t in types)}, got {value!r:.40}")
    return problems


# ----- summary.json --------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class LevelTally(Record):
    """Accuracy of one level (or one value of a breakdown field): flowllm/scoring/tally.py's ``score_tally``."""

    tasks: int = 0
    scored: int | None = None  # None: a summary written before unscored tasks were told apart
    unscored: int | None = None
    correct: int = 0
    accuracy: float | None = None

    @property
    def scored_count(self) -> int:
        return self.tasks if self.scored is None else self.scored


@dataclass(kw_only=True)
class InfraFailures(Record):
    """Tool calls failed by infrastructure (not the model): in total, by cause, and the tasks they hurt."""

    total: int = 0
    by_cause: dict[str, int] = field(default_factory=dict)
    tasks: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class CostBlock(Record):
    """What the run folder was billed (``cost``): the ledgers' total split agent / judge, and the price used."""

    total_usd: float | None = None
    model: str | None = None
    note: str | None = field(default=None, metadata=OPTIONAL)
    agent_usd: float | None = field(default=None, metadata=OPTIONAL)
    judge_usd: float | None = field(default=None, metadata=OPTIONAL)
    tokens: int | None = field(default=None, metadata=OPTIONAL)
    judge_tokens: int | None = field(default=None, metadata=OPTIONAL)
    price_per_million: dict[str, Any] | None = field(default=None, metadata=OPTIONAL)
    estimated_tokens: bool | None = field(default=None, metadata=OPTIONAL)
    # a replay: nothing billed; the saved run's cost beside it
    replayed: bool | None = field(default=None, metadata=OPTIONAL)
    saved_run_usd: float | None = field(default=None, metadata=OPTIONAL)
    forked: bool | None = field(default=None, metadata=OPTIONAL)
    batch_factor: float | None = field(default=None, metadata=OPTIONAL)
    of: str | None = field(default=None, metadata=OPTIONAL)  # what the total counts


@dataclass(kw_only=True)
class ReplayBlock(Record):
    """A replay's tasks by how they replayed (flowllm/run/replay_audit.py), and its accuracy on those scored."""

    exact: int = 0
    diverged: int = 0
    missing: int = 0
    unverified: int = 0
    forked: int = 0
    exact_correct: int = 0
    accuracy_exact: float | None = None
    scored: int | None = None  # None: an older summary (then scored = exact)
    unscored: int = 0
    scored_correct: int | None = None
    accuracy_scored: float | None = None
    live_calls: int = 0
    effect_not_known: str | None = field(default=None, metadata=OPTIONAL)


@dataclass(kw_only=True)
class ForkBlock(Record):
    """A fork's live spending, and what a full live re-run would have cost (flowllm/spend/fork_accounting.py)."""

    live: str | None = None
    fork_at_turn: int | None = None
    saved_run: str | None = None
    live_calls: int | None = None
    live_tokens: int | None = None
    live_cost_usd: float | None = None
    full_rerun_calls: int | None = None
    full_rerun_cost_usd: float | None = None
    saved_calls: int | None = None
    saved_usd: float | None = None


@dataclass(kw_only=True)
class ToolsBlock(Record):
    """The run's tool servers: None is "not known here" (the parent of several workers), never "none"."""

    unavailable: dict[str, Any] | None = None
    start_s: float | None = None
    sandbox_gaps: Any = None

    @property
    def unavailable_recorded(self) -> bool:
        """Whether ``unavailable`` was written (null included: not known); a summary older than it has not."""
        return self.loaded_keys is None or "unavailable" in self.loaded_keys


@dataclass(kw_only=True)
class StatsBlock(Record):
    """Accuracy with its uncertainty (flowllm/run/stats.py); each estimate is a scoring.stats.Estimate's dict."""

    confidence: float | None = None
    epochs: int = 1
    epoch_reducer: str | None = None
    interval_requested: str | None = None
    bootstrap: dict[str, Any] | None = None
    cluster_by: str | None = None
    scored: int = 0
    unscored: int = 0
    accuracy: dict[str, Any] = field(default_factory=dict)
    by_level: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_field: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    pass_at_k: dict[str, float | None] | None = field(default=None, metadata=OPTIONAL)  # epochs > 1
    pass_hat_k: dict[str, float | None] | None = field(default=None, metadata=OPTIONAL)


@dataclass(kw_only=True)
class BudgetBlock(Record):
    """What the run's budget did (flowllm/run/budget_report.py): its caps, the spend, the tasks it stopped."""

    cost_usd: float | None = None
    tokens: int | None = None
    spent: dict[str, Any] = field(default_factory=dict)  # cost_usd, tokens
    ended_run: bool = False
    reason: str | None = None
    stopped_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> tokens, cost_usd, turns
    not_started: int = 0
    # experiment.coordination: what every process sharing the budget had spent when this run ended (cost_usd,
    # tokens); the budget ended the run when that reached it. None: the budget was this folder's own.
    shared_spent: dict[str, Any] | None = None


@dataclass(kw_only=True)
class ContaminationBlock(Record):
    """Benchmark answer sources: what the web tools' guard refused (flowllm/tools/web/guard.py) and the tasks
    whose answer reached the agent from outside their own files (flowllm/export/contamination.py), with the
    accuracy over all scored tasks and over those not flagged (each a scoring.stats.Estimate's dict)."""

    blocked: int = 0  # search results withheld and pages refused
    blocked_by_tool: dict[str, int] = field(default_factory=dict)
    blocked_tasks: list[str] = field(default_factory=list)
    flagged: int = 0  # tasks whose ground truth (or an answer pattern) came back in a tool result from outside
    flagged_tasks: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)  # tools.web.answer_patterns the audit also looked for
    accuracy: dict[str, Any] = field(default_factory=dict)
    accuracy_excluding_flagged: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class RunSummary(Versioned):
    """``summary.json``: the run's figures (flowllm/run/runner.py ``summarize``, flowllm/setup/build.py)."""

    tasks: int = 0
    finished: int | None = None
    completed: int = 0
    failed: int = 0
    limited: int = 0
    limits: dict[str, int] = field(default_factory=dict)
    unfinished: int = 0
    resumed: int = 0
    # Tasks a rerun resumed inside, and the model calls their saved turns answered (flowllm/run/resume.py).
    resumed_tasks: int = field(default=0, metadata=OPTIONAL)
    resumed_turns: int = field(default=0, metadata=OPTIONAL)
    correct: int | None = None
    scored: int | None = None  # None: a summary written before unscored tasks were told apart
    unscored: int = 0
    accuracy: float | None = None
    accuracy_of: str | None = None
    by_level: dict[str, LevelTally] = field(default_factory=dict)
    attempts: int = 1
    attempts_used: int = 0
    turns: int = 0
    tool_calls: int = 0
    bad_tool_calls: int = 0
    failed_tool_calls: int = 0
    infra_tool_failures: InfraFailures | None = None
    tool_calls_made: int | None = None
    tool_calls_parsed: int | None = None
    parse_rate: float | None = None
    repairs: dict[str, int] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)  # the finished tasks' tokens: core.types.Usage.to_dict()
    tokens: dict[str, int] = field(default_factory=dict)
    cost: CostBlock | None = None
    cost_usd: float | None = None
    wall_seconds: float = 0.0
    interrupted: bool = False
    replay: ReplayBlock | None = field(default=None, metadata=OPTIONAL)
    status: str | None = None  # finished | interrupted | failed | error (a multirun job that could not run)
    error: str | None = field(default=None, metadata=OPTIONAL)
    tools: ToolsBlock | None = None
    experiment: str | None = None
    provider: str | None = None
    model: str | None = None
    runner: str | None = None
    repair: str | None = None
    dataset: str | None = None
    providers: dict[str, Any] = field(default_factory=dict)  # the ledger's summary (UsageLedger.summary)
    scorer: str | None = None
    scoring_errors: int = 0
    accuracy_scored: float | None = None
    breakdown: dict[str, dict[str, LevelTally]] = field(default_factory=dict)
    # dataset.scorer=judge: the judge's verdicts and spend
    judge: dict[str, Any] | None = field(default=None, metadata=OPTIONAL)
    fork: ForkBlock | None = field(default=None, metadata=OPTIONAL)
    stats: StatsBlock | None = None
    budget: BudgetBlock | None = None
    acted: dict[str, Any] | None = None  # what the resilience and agent features did (run/report.py)
    # the contamination guard's blocks and audit (absent from summaries written before them)
    contamination: ContaminationBlock | None = field(default=None, metadata=OPTIONAL)
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def scored_count(self) -> int:
        """Scored tasks; a summary older than ``scored`` counted every task."""
        return self.tasks if self.scored is None else self.scored

    @property
    def budget_ended_run(self) -> bool:
        return self.budget is not None and self.budget.ended_run

    @classmethod
    def job_error(cls, message: str) -> RunSummary:
        """The summary of a multirun job that could not run: its status and why, nothing else."""
        return cls.from_dict({"format_version": FORMAT_VERSION, "status": "error", "error": message})


# The keys every line of a type has (UsageLedger.attempt, ResilientProvider's call and skip lines), null or not.
_LINE_KEYS: dict[str, tuple[str, ...]] = {
    "attempt": (
        *("ts", "hour", "call", "task_id", "agent", "turn", "user", "provider", "protocol", "model", "attempt"),
        *("key", "fallback", "outcome", "status", "retry_after_s", "error", "latency_s", "limiter_wait_s"),
        *("usage", "cost_usd"),
    ),
    "call": (
        *("call", "task_id", "agent", "turn", "provider", "model", "outcome", "error", "fallback"),
        *("failed_providers", "attempts", "breaker_wait_s", "wait_s"),
    ),
    "skip": ("call", "provider", "reason", "task_id", "agent", "turn"),
}


# ----- usage.jsonl ---------------------------------------------------------------------------------------------
# A failed attempt whose reply arrived, was read, and was of no use (an empty reply): the provider billed it.
BILLED_FAILURES = frozenset({ErrorKind.EMPTY_REPLY.value})


@dataclass(kw_only=True)
class LedgerLine(Record):
    """One line of the usage ledger (flowllm/providers/ledger.py): ``type`` says which of its fields it has.

    ``attempt``: one request to one provider; ``call``: how one send ended; ``skip``: a provider passed over;
    ``breaker``: a circuit transition; ``key``: a key's cooldown or retirement. Every field is optional: a line
    has those of its type (a built line writes the ones that are set)."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("type",)

    type: str = ""
    ts: float | None = field(default=None, metadata=OPTIONAL)
    hour: str | None = field(default=None, metadata=OPTIONAL)
    call: int | None = field(default=None, metadata=OPTIONAL)
    task_id: str | None = field(default=None, metadata=OPTIONAL)
    agent: str | None = field(default=None, metadata=OPTIONAL)
    turn: int | None = field(default=None, metadata=OPTIONAL)
    user: str | None = field(default=None, metadata=OPTIONAL)
    provider: str | None = field(default=None, metadata=OPTIONAL)
    protocol: str | None = field(default=None, metadata=OPTIONAL)
    model: str | None = field(default=None, metadata=OPTIONAL)
    attempt: int | None = field(default=None, metadata=OPTIONAL)
    key: str | None = field(default=None, metadata=OPTIONAL)
    fallback: bool | None = field(default=None, metadata=OPTIONAL)
    outcome: str | None = field(default=None, metadata=OPTIONAL)
    status: int | None = field(default=None, metadata=OPTIONAL)
    retry_after_s: float | None = field(default=None, metadata=OPTIONAL)
    error: str | None = field(default=None, metadata=OPTIONAL)
    latency_s: float | None = field(default=None, metadata=OPTIONAL)
    limiter_wait_s: float | None = field(default=None, metadata=OPTIONAL)
    usage: dict[str, Any] | None = field(default=None, metadata=OPTIONAL)
    cost_usd: float | None = field(default=None, metadata=OPTIONAL)
    epoch: int | None = field(default=None, metadata=OPTIONAL)
    batch: dict[str, Any] | None = field(default=None, metadata=OPTIONAL)
    failed_providers: list[str] | None = field(default=None, metadata=OPTIONAL)
    attempts: int | None = field(default=None, metadata=OPTIONAL)
    breaker_wait_s: float | None = field(default=None, metadata=OPTIONAL)
    wait_s: float | None = field(default=None, metadata=OPTIONAL)
    reason: str | None = field(default=None, metadata=OPTIONAL)
    from_state: str | None = field(default=None, metadata={**OPTIONAL, KEY: "from"})
    to_state: str | None = field(default=None, metadata={**OPTIONAL, KEY: "to"})
    event: str | None = field(default=None, metadata=OPTIONAL)
    at: float | None = field(default=None, metadata=OPTIONAL)

    def omitted_keys(self) -> set[str]:
        """A built line writes the keys of its type (null where not known) and any other field that is set."""
        always = _LINE_KEYS.get(self.type, ())
        return {key for key in super().omitted_keys() if key not in always}

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def billed(self) -> bool:
        """Whether the provider billed this attempt: it answered, or its reply arrived but could not be used (an
        empty reply: paid for all the same). A request refused, lost or cut short is not billed."""
        return self.outcome == "ok" or self.outcome in BILLED_FAILURES
