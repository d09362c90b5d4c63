"""The config saved in the folder is the config that ran: its settings that can change a result, recomputed, are
the ones recorded in ``fingerprint.json`` when the run was accepted, and in the last line of ``history.jsonl``;
the dataset's files are the ones the provenance hashed.
"""

from __future__ import annotations

from flowllm.setup.fingerprint import Fingerprint, compute, dataset_files
from flowllm.verify.evidence import RunEvidence
from flowllm.verify.findings import Audit

__all__ = ["DIGEST_FIELDS", "check_settings"]

CONFIG = ".hydra/config.yaml"
MASKED = "***"  # a secret the redactor hid when the fingerprint was written: not comparable
# The fields that compare the fingerprint's digest with what the run wrote (a bundle whose fingerprint had a secret
# masked cannot recompute the digest: flowllm/bundle/check.py leaves these two out).
SESSION_DIGEST = "last session: fingerprint"
PROVENANCE_DIGEST = "provenance.config_fingerprint"
DIGEST_FIELDS = (SESSION_DIGEST, PROVENANCE_DIGEST)


def check_settings(ev: RunEvidence, audit: Audit) -> None:
    recorded = Fingerprint.from_dict(ev.fingerprint) if ev.fingerprint is not None else None
    if recorded is None:
        audit.skip("the saved config: the folder has no fingerprint.json (made before fingerprints)")
        return
    now = compute(ev.cfg, ev.dataset_path)
    for key in dict.fromkeys([*recorded.settings, *now.settings]):
        saved, ran = now.settings.get(key), recorded.settings.get(key)
        if MASKED in str(ran):
            continue
        audit.check(CONFIG, key, saved, ran, "fingerprint.json: the settings the results were made with")
    sessions = [line for line in ev.history if "control" not in line]  # flowllm ctl's lines are no session's
    if sessions:
        audit.check("history.jsonl", SESSION_DIGEST, sessions[-1].get("fingerprint"), recorded.digest)
    provenance = ev.summary.provenance
    if provenance:
        audit.check("summary.json", PROVENANCE_DIGEST, provenance.get("config_fingerprint"), recorded.digest)
    files = dataset_files(ev.dataset_path)
    audit.check("fingerprint.json", "dataset_files", recorded.dataset_files, files, f"the files of {ev.dataset_path}")
