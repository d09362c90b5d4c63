"""What of a run folder goes into a bundle, and in what form: the files that recompute the run's numbers, with
ground truth taken out (unless asked to keep it) and every secret value masked.

In: the config as it ran and its overrides, the fingerprint, the history of sessions, the summary (with its
provenance), the usage ledgers, the web cache, and under ``tasks/`` every node's saved input, output and meta,
each result and timing; for a replay or a fork, the provider section of the run that made its replies
(``replayed_provider.json``: its bundle is read where that run is not). Out: the log (it may quote anything),
Hydra's own settings (the environment it ran in), each task's workspace (the dataset's attachments and what the
tools wrote: the replay makes them again), and, without answers, the judge's conversations (their prompts quote
the answer).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from omegaconf import OmegaConf

from flowllm.bundle.answers import answer_hash, strip_answers
from flowllm.bundle.manifest import BundleInputError, JobEntry
from flowllm.config.saved import saved_section
from flowllm.engine.recorder import environment_secrets
from flowllm.errors import FlowError
from flowllm.providers.replay import REPLAY_PROTOCOL, origin_provider_section
from flowllm.rundir.layout import (
    CONFIG_FILE,
    DIGESTS_FILE,
    FINGERPRINT_FILE,
    HISTORY_FILE,
    JUDGE_LEDGER_FILE,
    LEDGER_FILE,
    OVERRIDES_FILE,
    REPLAYED_PROVIDER_FILE,
    RESULT_FILE,
    SUMMARY_FILE,
    TASKS_DIR,
    VERDICT_FILE,
    WEB_CACHE_DIR,
    WORKSPACE_DIR,
)
from flowllm.rundir.results import TaskResult
from flowllm.scoring.judge import JUDGE_SCOPE

__all__ = ["MASK", "RunFiles", "collect_run", "config_secrets"]

TOP_FILES = (
    CONFIG_FILE,
    OVERRIDES_FILE,
    FINGERPRINT_FILE,
    HISTORY_FILE,
    SUMMARY_FILE,
    LEDGER_FILE,
    JUDGE_LEDGER_FILE,
    REPLAYED_PROVIDER_FILE,
)
MIN_SECRET_CHARS = 8  # as the recorder's redactor: shorter values would mask innocent text
MASK = "REDACTED"  # what a secret value reads as in the bundle (plain: an override holding it still parses)
# Config keys whose values name environment variables that hold a credential (provider.api_key_env: several,
# comma-separated; a tool server's headers: header -> variable).
_ENV_NAME_KEYS = ("api_key_env",)
_ENV_MAP_KEYS = ("headers",)
# A tool server's ``env`` holds values: those of variables named like a secret are secrets.
_LITERAL_MAP_KEYS = ("env",)
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$|SECRET|PRIVATE", re.I)
_CREDENTIAL_KEY = re.compile(r"^(authorization|proxy-authorization|x-api-key|api[-_]?key|.*_api_key|secret)$", re.I)


@dataclass
class RunFiles:
    """One run's files as they go into the bundle (relative path -> content) and its manifest entry."""

    job: JobEntry
    files: dict[str, bytes] = field(default_factory=dict)


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key), item
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def _literal(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and not value.startswith("${")


def config_secrets(config: Any) -> set[str]:
    """The secret values a config leads to: those of the environment variables it names as holding keys or
    header values, and the values it holds itself under a credential's name (a tool server's ``env`` entry
    named like a secret, an ``api_key``)."""
    names: set[str] = set()
    values: set[str] = set()
    for key, value in _walk(config):
        if key in _ENV_NAME_KEYS and isinstance(value, str):
            names.update(part.strip() for part in value.split(","))
        elif key in _ENV_MAP_KEYS and isinstance(value, dict):
            names.update(str(v) for v in value.values() if isinstance(v, str))
        elif key in _LITERAL_MAP_KEYS and isinstance(value, dict):
            values.update(str(v) for k, v in value.items() if _SECRET_NAME.search(str(k)) and _literal(v))
        elif _CREDENTIAL_KEY.match(key) and _literal(value):
            values.add(str(value))
    return values | {os.environ[name] for name in names if name and os.environ.get(name)}


def setting_secrets(settings: dict[str, Any]) -> set[str]:
    """The secret values of a fingerprint's flat settings (``tools.servers.x.env.NAME``, ``...api_key``)."""
    found = set()
    for key, value in settings.items():
        parts = key.split(".")
        named_secret = len(parts) > 1 and parts[-2] in _LITERAL_MAP_KEYS and _SECRET_NAME.search(parts[-1])
        if _literal(value) and (named_secret or _CREDENTIAL_KEY.match(parts[-1])):
            found.add(str(value))
    return found


def _mask(data: bytes, secrets: list[str]) -> bytes:
    for secret in secrets:
        data = data.replace(secret.encode(), MASK.encode())
    return data


def _in_bundle(rel: Path, with_answers: bool) -> bool:
    parts = rel.parts
    if parts[0] != TASKS_DIR:
        return rel.as_posix() in TOP_FILES or parts[0] == WEB_CACHE_DIR
    if WORKSPACE_DIR in parts or rel.name == DIGESTS_FILE:  # digests: of the records before masking and stripping
        return False
    return with_answers or JUDGE_SCOPE not in parts


def _json(data: bytes, where: Path) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BundleInputError(f"{where} is not valid JSON (truncated?): {exc}") from None


def _config(run_dir: Path) -> tuple[Any, str]:
    """The saved config as plain data, and the dataset path it names (its interpolations resolved)."""
    try:
        loaded = OmegaConf.load(run_dir / CONFIG_FILE)
        return OmegaConf.to_container(loaded, resolve=False), str(OmegaConf.select(loaded, "dataset.path") or "")
    except Exception as exc:  # omegaconf and yaml raise many types; all mean "unreadable config"
        raise BundleInputError(f"{run_dir / CONFIG_FILE} cannot be read: {exc}".splitlines()[0]) from None


def _replayed_provider(run_dir: Path) -> dict[str, Any] | None:
    """A replay's (or fork's) record of the provider that made the replies it served, for a bundle that is read
    where the run it replayed is not (``REPLAYED_PROVIDER_FILE``); None for a run that called its model itself."""
    try:
        if saved_section(run_dir / CONFIG_FILE, "provider.protocol") != REPLAY_PROTOCOL:
            return None
        origin, chain = origin_provider_section(run_dir)
    except FlowError as exc:
        raise BundleInputError(f"{run_dir} is a replay whose replayed run cannot be read here ({exc})") from None
    return origin if len(chain) > 1 else None  # one: it keeps the record already (a bundled replay, unpacked)


def _run_files(run_dir: Path, with_answers: bool, origin: dict[str, Any] | None) -> Iterator[tuple[Path, bytes]]:
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(run_dir)
        if _in_bundle(rel, with_answers):
            yield rel, path.read_bytes()
    if origin is not None:
        yield Path(REPLAYED_PROVIDER_FILE), orjson.dumps(origin, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def collect_run(run_dir: Path, name: str, *, with_answers: bool) -> RunFiles:
    """The bundle's files of one run folder; raises ``BundleInputError`` when it is not a run."""
    if not (run_dir / CONFIG_FILE).is_file() or not (run_dir / SUMMARY_FILE).is_file():
        raise BundleInputError(f"{run_dir} is not a run folder (no {CONFIG_FILE} or {SUMMARY_FILE})")
    config, dataset = _config(run_dir)
    fingerprint_path = run_dir / FINGERPRINT_FILE
    fingerprint = _json(fingerprint_path.read_bytes(), fingerprint_path) if fingerprint_path.is_file() else {}
    fingerprint = fingerprint if isinstance(fingerprint, dict) else {}
    settings = fingerprint.get("settings")
    settings = settings if isinstance(settings, dict) else {}
    origin = _replayed_provider(run_dir)
    secrets = {*environment_secrets(), *config_secrets(config), *setting_secrets(settings)}
    secrets |= set(config_secrets({"provider": origin})) if origin is not None else set()
    masked = sorted((s for s in secrets if len(s) >= MIN_SECRET_CHARS), key=len, reverse=True)
    job = JobEntry(name=name, dataset=dataset, dataset_files=dict(fingerprint.get("dataset_files") or {}))
    found = RunFiles(job)
    for rel, data in _run_files(run_dir, with_answers, origin):
        if rel.name in (RESULT_FILE, VERDICT_FILE) and rel.parts[0] == TASKS_DIR:
            record = _json(data, rel)
            if rel.name == RESULT_FILE and len(rel.parts) == 3:  # tasks/<folder>/result.json: the task's own
                result = TaskResult.from_dict(record)
                job.ground_truth[result.task_id] = answer_hash(result.ground_truth)
            if not with_answers:
                data = orjson.dumps(strip_answers(record), option=orjson.OPT_INDENT_2) + b"\n"
        kept = _mask(data, masked)
        if kept != data:
            job.masked.append(rel.as_posix())
        found.files[rel.as_posix()] = kept
    return found
