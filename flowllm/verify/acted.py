"""``summary.json``'s ``acted`` against the node records: the turns trimming changed or dropped, the compactions
and the memories recalled, counted again from every conversation of every task, epoch and attempt."""

from __future__ import annotations

from flowllm.run.report import context_acted
from flowllm.rundir.layout import SUMMARY_FILE
from flowllm.verify.evidence import RunEvidence
from flowllm.verify.findings import Audit

__all__ = ["check_acted"]

CONTEXT_KEYS = ("trimmed_turns", "dropped_turns", "compactions", "memories_recalled")


def check_acted(ev: RunEvidence, audit: Audit) -> None:
    acted = ev.summary.acted or {}
    if acted.get("compactions") is None:  # not counted: the records of completed tasks were not all kept
        return
    again = context_acted(ev.layout.tasks)
    for key in CONTEXT_KEYS:
        if key in acted:
            audit.check(SUMMARY_FILE, f"acted.{key}", acted[key], again[key], "the node records")
