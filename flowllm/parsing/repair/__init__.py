"""JSON repair as a configurable chain of stages.

    repair_json(text, key=None, stages=None) -> Repaired(ok, value, stage, error, raw)
    repair_arguments(text, stages=None)      -> the same, but ``value`` is always a dict when ok

``stages`` is a list of stage names run in order (``conf/repair/*.yaml``); None means the full chain. The first
stage is normally ``strict``, so clean input costs one parse. Repair never raises: whatever goes wrong comes
back as ``ok=False`` with an error message and the raw text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from flowllm.errors import ConfigError
from flowllm.parsing.repair.lenient import CODE_FIELDS, decode_string, parse_lenient
from flowllm.parsing.repair.stages import (
    FULL_CHAIN,
    PRESETS,
    STAGE_BY_NAME,
    STAGE_LIST,
    Found,
    Stage,
    loads_strict,
)
from flowllm.parsing.safety import DEFAULT_MAX_CHARS, failure_reason, too_long_reason
from flowllm.parsing.types import Repaired

STAGES: dict[str, Callable[[str, str | None], Any]] = {s.name: s.fn for s in STAGE_LIST}


def validate_stages(stages: Sequence[str]) -> None:
    """Raise ``ValueError`` naming any unknown stage and the valid ones (called once at start-up)."""
    if isinstance(stages, str):
        raise ConfigError(f"repair stages must be a list of names, got the string {stages!r}")
    unknown = [s for s in stages if s not in STAGE_BY_NAME]
    if unknown:
        raise ValueError(
            f"unknown repair stage{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"valid stages are: {', '.join(STAGE_BY_NAME)}"
        )
    if not stages:
        raise ConfigError(f"the repair chain is empty; list at least 'strict' (valid: {', '.join(STAGE_BY_NAME)})")


def _as_text(text: Any) -> str | None:
    if isinstance(text, str):
        return text
    if isinstance(text, bytes | bytearray):
        return bytes(text).decode("utf-8", "replace")
    return None


def repair_json(
    text: Any, key: str | None = None, stages: Sequence[str] | None = None, max_chars: int | None = DEFAULT_MAX_CHARS
) -> Repaired:
    """Read ``text`` as JSON, repairing it with ``stages`` (default: the full chain).

    ``key`` is the name of the field ``text`` is the value of, when known (a parameter of an XML tool call):
    a code field (``CODE_FIELDS``) gets structure-only repair, and a bare string, number or literal is then
    an acceptable result too. A text longer than ``max_chars`` (None: no limit) is refused unread.
    """
    try:
        if max_chars is not None and isinstance(text, str | bytes | bytearray) and len(text) > max_chars:
            return Repaired(False, None, None, too_long_reason(len(text), max_chars), _raw(text))
        return _repair_json(text, key, stages)
    except Exception as exc:  # the chain guards each stage; this guards the chain itself
        return Repaired(False, None, None, f"could not be repaired: {failure_reason(exc)}", _raw(text))


def _raw(text: Any) -> str:
    source = _as_text(text)
    return source if source is not None else f"<{type(text).__name__}>"


def _repair_json(text: Any, key: str | None, stages: Sequence[str] | None) -> Repaired:
    if stages is None and type(text) is str:
        try:  # the fast path, inlined: clean input pays one parse and one object
            return Repaired(True, loads_strict(text), "strict", None, text)
        except (ValueError, RecursionError):
            pass
        names: Sequence[str] = FULL_CHAIN[1:]
        first_error = None
    else:
        names = FULL_CHAIN if stages is None else stages
        first_error = None
    source = _as_text(text)
    if source is None:
        return Repaired(False, None, None, f"expected text, got {type(text).__name__}", repr(text))
    current = source
    for name in names:
        stage: Stage | None = STAGE_BY_NAME.get(name)
        if stage is None:
            return Repaired(False, None, None, f"unknown repair stage {name!r}", source)
        try:
            out = stage.fn(current, key)
        except Exception:
            continue
        if out is None:
            continue
        if isinstance(out, Found):
            return Repaired(True, out.value, name, None, source)
        try:
            return Repaired(True, loads_strict(out), name, None, source)
        except (ValueError, RecursionError):
            if stage.carries:
                current = out
    if first_error is None:
        first_error = _strict_error(source)
    tried = ", ".join(names) if names else "none"
    return Repaired(False, None, None, f"{first_error} (repair stages tried: {tried})", source)


def _strict_error(text: str) -> str:
    if not text.strip():
        return "empty text"
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        return f"invalid JSON: {e}"
    except (ValueError, RecursionError, MemoryError) as e:
        return f"invalid JSON: {failure_reason(e)}"
    return "invalid JSON"


def repair_arguments(
    text: Any, stages: Sequence[str] | None = None, max_chars: int | None = DEFAULT_MAX_CHARS
) -> Repaired:
    """Tool-call arguments as a dict: ``repair_json``, then a string holding an object is decoded once and
    any other value becomes ``{"value": v}``. Empty text means no arguments (``{}``). Never raises."""
    try:
        if max_chars is not None and isinstance(text, str | bytes | bytearray) and len(text) > max_chars:
            return Repaired(False, None, None, too_long_reason(len(text), max_chars), _raw(text))
        return _repair_arguments(text, stages)
    except Exception as exc:
        return Repaired(False, None, None, f"could not be repaired: {failure_reason(exc)}", _raw(text))


def _repair_arguments(text: Any, stages: Sequence[str] | None) -> Repaired:
    if isinstance(text, dict):
        return Repaired(True, text, "native", None, json.dumps(text, ensure_ascii=False))
    if stages is None and type(text) is str:
        try:
            value = loads_strict(text)
        except (ValueError, RecursionError):
            pass
        else:
            if type(value) is dict:
                return Repaired(True, value, "strict", None, text)
            return _wrap(Repaired(True, value, "strict", None, text), stages)
    source = _as_text(text)
    if source is not None and not source.strip():
        return Repaired(True, {}, "empty", None, source)
    return _wrap(_repair_json(text, None, stages), stages)


def _wrap(r: Repaired, stages: Sequence[str] | None) -> Repaired:
    if not r.ok or isinstance(r.value, dict):
        return r
    value = r.value
    if isinstance(value, str):
        inner = repair_json(value, None, ["strict"])
        if inner.ok and isinstance(inner.value, dict):
            return Repaired(True, inner.value, "double_encoded", None, r.raw)
    return Repaired(True, {"value": value}, r.stage, None, r.raw)


__all__ = [
    "CODE_FIELDS",
    "PRESETS",
    "STAGES",
    "decode_string",
    "parse_lenient",
    "repair_arguments",
    "repair_json",
    "validate_stages",
]
