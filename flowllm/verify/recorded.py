"""The summary's blocks read from the node records, recomputed: ``contamination`` (the guard's blocks and the
audit's flags read again from the saved tool results, flowllm/export/contamination.py, and both accuracies with
their intervals) and ``acted`` (the turns trimming changed or dropped, the compactions and the memories recalled,
counted again in every conversation of every task, epoch and attempt)."""

from __future__ import annotations

from flowllm.export.contamination import audit_run
from flowllm.run.report import context_acted
from flowllm.verify.evidence import RunEvidence
from flowllm.verify.findings import Audit, same
from flowllm.verify.totals import SUMMARY, check_leaves, stats_settings

__all__ = ["check_acted", "check_contamination"]

CONTEXT_KEYS = ("trimmed_turns", "dropped_turns", "compactions", "memories_recalled")


def check_contamination(ev: RunEvidence, audit: Audit) -> None:
    saved = ev.summary.contamination
    if saved is None:
        return  # written before the audit existed: `python -m flowllm.inspect audit RUN` audits it
    recomputed = audit_run(ev.run_dir, saved.patterns).block(stats_settings(ev)).to_dict()
    if same(saved.to_dict(), recomputed):
        audit.compared += 1
    else:
        check_leaves(audit, SUMMARY, "contamination", saved.to_dict(), recomputed)


def check_acted(ev: RunEvidence, audit: Audit) -> None:
    acted = ev.summary.acted or {}
    if acted.get("compactions") is None:  # not counted: the records of completed tasks were not all kept
        return
    again = context_acted(ev.layout.tasks)
    for key in CONTEXT_KEYS:
        if key in acted:
            audit.check(SUMMARY, f"acted.{key}", acted[key], again[key], "the node records")
