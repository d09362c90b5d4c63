"""A run's provenance (``summary.json`` → ``provenance``) and its result-changing settings (``fingerprint.json``)
as inspect shows them: a table for one run, and for ``diff`` every difference, before anything else."""

from __future__ import annotations

from typing import Any

from flowllm.inspect.artifacts import RunRecord, summary_figures
from flowllm.setup.fingerprint import flatten, read_fingerprint

NOT_RECORDED = "not recorded"


def provenance_of(run: RunRecord) -> dict[str, Any] | None:
    value = summary_figures(run).provenance
    return value if isinstance(value, dict) and value else None


def provenance_rows(run: RunRecord) -> list[tuple[str, str]]:
    """The provenance, one row per fact; empty for a run written before provenance was recorded."""
    data = provenance_of(run)
    if data is None:
        return []
    source = data.get("flowllm") or {}
    commit = source.get("commit")
    where = (
        "not a git checkout" if commit is None else f"{str(commit)[:12]}" + (" (dirty)" if source.get("dirty") else "")
    )
    python = data.get("python") or {}
    host = data.get("os") or {}
    prices = data.get("price_table") or {}
    files = data.get("dataset_files")
    rows = [
        ("flowllm", f"{source.get('version')}, {where}"),
        ("python", f"{python.get('version')} ({python.get('implementation')})"),
        ("packages", ", ".join(f"{k} {v}" for k, v in (data.get("packages") or {}).items())),
        ("config fingerprint", str(data.get("config_fingerprint"))[:16]),
    ]
    earlier = data.get("earlier_fingerprints") or []
    if earlier:
        rows.append(
            ("mixed with", ", ".join(str(e)[:16] for e in earlier) + " (experiment.resume=force kept their results)")
        )
    if isinstance(files, dict):
        shown = ", ".join(f"{name} {str(digest)[:12]}" for name, digest in list(files.items())[:5])
        more = f" and {len(files) - 5} more" if len(files) > 5 else ""
        rows.append(("dataset files", f"{len(files)}: {shown}{more}" if files else "none found"))
    rows.append(("price table", f"{prices.get('path')} sha256 {str(prices.get('sha256'))[:12]}"))
    rows.append(("os", str(host.get("platform"))))
    return rows


def _settings(run: RunRecord) -> dict[str, Any]:
    recorded = read_fingerprint(run.path)
    return {} if recorded is None else dict(recorded.settings)


def provenance_changes(a: RunRecord, b: RunRecord) -> dict[str, tuple[Any, Any]]:
    """Every provenance fact and every result-changing setting that differs between two runs, provenance first.

    The host's exact kernel build aside, nothing is left out: a different commit, a dirty tree, another SDK
    version or dataset file hash is a reason two runs' numbers differ."""
    changes: dict[str, tuple[Any, Any]] = {}
    prov_a, prov_b = provenance_of(a), provenance_of(b)
    if prov_a is not None or prov_b is not None:
        flat_a = flatten(prov_a or {}, "provenance") if prov_a is not None else {}
        flat_b = flatten(prov_b or {}, "provenance") if prov_b is not None else {}
        for key in sorted(set(flat_a) | set(flat_b)):
            if key == "provenance.price_table.path":  # where the file was found, not what it says
                continue
            x, y = flat_a.get(key, NOT_RECORDED), flat_b.get(key, NOT_RECORDED)
            if x != y:
                changes[key] = (x, y)
    set_a, set_b = _settings(a), _settings(b)
    if set_a and set_b:
        for key in sorted(set(set_a) | set(set_b)):
            x, y = set_a.get(key, NOT_RECORDED), set_b.get(key, NOT_RECORDED)
            if x != y:
                changes[key] = (x, y)
    return changes
