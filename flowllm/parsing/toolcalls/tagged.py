"""The ``<tool_call>`` family, told apart by what the tags hold.

* ``hermes``: JSON, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (also several objects in one
  block, separated by commas).
* ``qwen3_coder``: XML, ``<tool_call><function=NAME><parameter=KEY>value</parameter></function></tool_call>``;
  the ``<tool_call>`` wrapper may be missing, and so may a ``</parameter>``.
* ``glm4``: ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>value</arg_value></tool_call>``.

XML parameter values are text; the tool's schema (when given) decides their JSON types.
"""

from __future__ import annotations

import re

from flowllm.parsing.toolcalls.base import (
    Context,
    Hit,
    RawCall,
    coerce_parameter,
    dumps,
    echoes_schemas,
    parse_call_object,
    schema_for,
)

MARKERS = ("<tool_call>", "<function=")
_OPEN = re.compile(r"<tool_call\s*>", re.I)
_CLOSE = re.compile(r"</tool_call\s*>", re.I)
_FUNCTION = re.compile(r"<function=([^>\n]*)(>?)")
_FUNCTION_CLOSE = re.compile(r"</function\s*>")
_PARAM = re.compile(r"<parameter=([^<>\n]+)>")
_PARAM_END = re.compile(r"</parameter\s*>|(?=<parameter=)|(?=</function\s*>)|\Z")


def _strip_value(v: str) -> str:
    # Values sit on their own lines (and may be indented): the layout is not part of the value.
    return v.strip()


def scan(text: str, ctx: Context, final: bool, formats: frozenset[str]) -> list[Hit]:
    hits: list[Hit] = []
    covered_until = 0
    opens = list(_OPEN.finditer(text))
    for idx, m in enumerate(opens):
        if m.start() < covered_until:
            continue
        limit = opens[idx + 1].start() if idx + 1 < len(opens) else len(text)
        close = _CLOSE.search(text, m.end(), limit)
        complete = close is not None or idx + 1 < len(opens)
        end = close.end() if close else limit
        covered_until = end
        if not complete and not final:
            hits.append(Hit(m.start(), end, complete=False))
            continue
        body = text[m.end() : close.start() if close else limit]
        hit = _read_block(body, m.start(), end, ctx, formats, complete)
        if hit:
            hits.extend(hit)
    if "qwen3_coder" in formats and "<function=" in text:
        # <function=...> blocks outside any <tool_call>: the wrapper was dropped (or only the opening one).
        spans = sorted((h.start, h.end) for h in hits)
        span_i = 0
        covered = 0  # the end of the last block read here
        closes = _NextMatch(_FUNCTION_CLOSE, text)
        for m in _FUNCTION.finditer(text):
            at = m.start()
            if at < covered:
                continue
            while span_i < len(spans) and spans[span_i][1] <= at:
                span_i += 1
            if span_i < len(spans) and spans[span_i][0] <= at:
                continue
            close = closes.after(m.end())
            if close is None and not final:
                hits.append(Hit(m.start(), len(text), complete=False))
                break
            end = close.end() if close else len(text)
            after = _CLOSE.match(text, end) or re.compile(r"\s*</tool_call\s*>").match(text, end)
            block_end = after.end() if after else end
            covered = block_end
            hits.extend(_qwen(text[m.start() : end], m.start(), block_end, ctx))
    return hits


class _NextMatch:
    """The first match of ``pattern`` at or after a position, for positions that only grow.

    One search serves every position up to the match it found, and a search that found nothing answers
    for every later position too: a text with many openers and no closer costs one scan, not one per opener.
    """

    __slots__ = ("_found", "_from", "_pattern", "_text")

    def __init__(self, pattern: re.Pattern[str], text: str) -> None:
        self._pattern, self._text = pattern, text
        self._from = -1
        self._found: re.Match[str] | None = None

    def after(self, pos: int) -> re.Match[str] | None:
        if self._from >= 0 and pos >= self._from and (self._found is None or self._found.start() >= pos):
            return self._found
        self._from = pos
        self._found = self._pattern.search(self._text, pos)
        return self._found


def _read_block(body: str, start: int, end: int, ctx: Context, formats: frozenset[str], complete: bool) -> list[Hit]:
    stripped = body.strip()
    if "<function=" in body:
        if "qwen3_coder" not in formats:
            return []
        return _qwen(body, start, end, ctx)
    if stripped[:1] in ("{", "["):
        if "hermes" not in formats:
            return []
        calls, error = parse_call_object(stripped, require_arguments=False)
        if error:
            if echoes_schemas(stripped):  # the model repeated its tool list inside the tags: text, not a call
                return [Hit(start, end, keep_text=True)]
            return [Hit(start, end, bad_reason=f"<tool_call> holds no readable call: {error}", keep_text=True)]
        return [Hit(start, end, c) for c in calls]
    if "<arg_key>" in body or ("glm4" in formats and re.match(r"\s*[\w.-]+\s*(?:\\n)?\s*\Z", body)):
        if "glm4" not in formats:
            return []
        return [_glm4(body, start, end, ctx)]
    if not stripped:
        return [Hit(start, end, bad_reason="empty <tool_call> block", keep_text=True)]
    if "hermes" in formats or "glm4" in formats:
        return [Hit(start, end, bad_reason="<tool_call> block is neither JSON nor XML arguments", keep_text=True)]
    return []


def _qwen(body: str, start: int, end: int, ctx: Context) -> list[Hit]:
    hits: list[Hit] = []
    closes = _NextMatch(_FUNCTION_CLOSE, body)
    for fm in _FUNCTION.finditer(body):
        name = fm.group(1).strip()
        if not fm.group(2) or not name:
            hits.append(Hit(start, end, bad_reason="<function= without a closing '>' after the name", keep_text=True))
            continue
        fclose = closes.after(fm.end())
        inner = body[fm.end() : fclose.start() if fclose else len(body)]
        props = schema_for(ctx, name)
        args: dict[str, object] = {}
        for pm in _PARAM.finditer(inner):
            key = pm.group(1).strip()
            vend = _PARAM_END.search(inner, pm.end())
            raw = inner[pm.end() : vend.start() if vend else len(inner)]
            args[key] = coerce_parameter(_strip_value(raw), props.get(key))
        hits.append(Hit(start, end, RawCall(name, dumps(args))))
    return hits


def _glm4(body: str, start: int, end: int, ctx: Context) -> Hit:
    first = body.find("<arg_key>")
    head = body[: first if first >= 0 else len(body)].strip()
    # The raw-string variant writes the newline after the name as a literal backslash-n.
    name = head.split("\n", 1)[0].strip().removesuffix("\\n").strip()
    if not name:
        return Hit(start, end, bad_reason="<tool_call> without a function name", keep_text=True)
    props = schema_for(ctx, name)
    args: dict[str, object] = {}
    for key, value in _glm4_args(body):
        args[key] = coerce_parameter(_strip_value(value), props.get(key))
    return Hit(start, end, RawCall(name, dumps(args)))


_KEY_OPEN, _KEY_CLOSE, _VALUE_CLOSE = "<arg_key>", "</arg_key>", "</arg_value>"
# \\n: the raw-string variant writes its line breaks as a literal backslash-n
_VALUE_OPEN = re.compile(r"(?:\s|\\n)*<arg_value>")


def _glm4_args(body: str) -> list[tuple[str, str]]:
    """``<arg_key>K</arg_key><arg_value>V</arg_value>`` pairs; a value without its close ends at the next key.

    Read with ``str.find``, each marker's position found once: a lazy regex would scan to the end of the
    text for every key whose close is missing."""
    out: list[tuple[str, str]] = []
    pos = 0
    next_value_close = next_key = -2
    while True:
        k = next_key if next_key >= pos else body.find(_KEY_OPEN, pos)
        if k < 0:
            break
        kc = body.find(_KEY_CLOSE, k + len(_KEY_OPEN))
        if kc < 0:
            break
        vm = _VALUE_OPEN.match(body, kc + len(_KEY_CLOSE))
        if vm is None:
            pos = kc + len(_KEY_CLOSE)
            continue
        v = vm.end()
        if next_value_close < v and next_value_close != -1:
            next_value_close = body.find(_VALUE_CLOSE, v)
        next_key = body.find(_KEY_OPEN, v)
        ends = [e for e in (next_value_close, next_key) if e >= 0]
        vend = min(ends) if ends else len(body)
        out.append((body[k + len(_KEY_OPEN) : kc].strip(), body[v:vend]))
        pos = vend + len(_VALUE_CLOSE) if vend == next_value_close else vend
    return out
