"""``summary.json → contamination`` recomputed: the guard's blocks and the audit's flags read again from the saved
tool results (flowllm/export/contamination.py), and both accuracies with their intervals."""

from __future__ import annotations

from flowllm.config.schema import IntervalMethod
from flowllm.export.contamination import audit_run
from flowllm.scoring.stats import StatsSettings
from flowllm.verify.evidence import RunEvidence
from flowllm.verify.findings import Audit, same
from flowllm.verify.totals import SUMMARY, check_leaves, saved_choice


def check_contamination(ev: RunEvidence, audit: Audit) -> None:
    saved = ev.summary.contamination
    if saved is None:
        return  # written before the audit existed: `python -m flowllm.inspect audit RUN` audits it
    cfg = ev.cfg
    settings = StatsSettings(
        interval=saved_choice(IntervalMethod, cfg.stats.interval),
        cluster_by=cfg.stats.cluster_by or None,
        resamples=int(cfg.stats.resamples),
        seed=int(cfg.stats.seed),
    )
    recomputed = audit_run(ev.run_dir, saved.patterns).block(settings).to_dict()
    if same(saved.to_dict(), recomputed):
        audit.compared += 1
    else:
        check_leaves(audit, SUMMARY, "contamination", saved.to_dict(), recomputed)
