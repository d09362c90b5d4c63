"""The run auditor: ``flowllm verify RUN`` recomputes every derived number of a run from its primary evidence
(the saved wire replies, the dataset files, the config as it ran, the price table) and names each disagreement.

    evidence.py   the run folder read strictly (a file that does not parse is bad input, exit 2)
    findings.py   one disagreement (file, field, both values) and the audit's record
    replies.py    the final reply of a conversation, normalised again from the saved wire reply
    tasks.py      each task's answer, ground truth, score and status against the evidence
    totals.py     the summary's tallies, statistics and replay accounting, recomputed
    spend.py      every ledger line's cost, the totals and the budget's verdict
    verdicts.py   per-task limits' verdicts and a fork's accounting
    exports.py    an Inspect AI log or a GAIA submission of the run against it (--export FILE)
    settings.py   the saved config against the fingerprint it ran under
    audit.py      the checks in order, for a run or a sweep folder
    cli.py        ``flowllm verify RUN [--json]``

It never writes into the run it audits.
"""

from __future__ import annotations

from flowllm.verify.audit import Verification, audit_path, audit_run, verification
from flowllm.verify.findings import Audit, Finding

__all__ = ["Audit", "Finding", "Verification", "audit_path", "audit_run", "verification"]
