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
    parse_call_object,
    schema_for,
)

MARKERS = ("<tool_call>", "<function=")
_OPEN = re.compile(r"<tool_call\s*>", re.I)
_CLOSE = re.compile(r"</tool_call\s*>", re.I)
_FUNCTION = re.compile(r"<function=([^>\n]*)(>?)")
_FUNCTION_CLOSE = re.compile(r"</function\s*>")
_PARAM = re.compile(r"<parameter=([^>\n]+)>")
_PARAM_END = re.compile(r"</parameter\s*>|(?=<parameter=)|(?=</function\s*>)|\Z")
_ARG = re.compile(
    # \\n: the raw-string variant writes its line breaks as a literal backslash-n
    r"<arg_key>(.*?)</arg_key>(?:\s|\\n)*<arg_value>(.*?)(?:</arg_value>|(?=<arg_key>)|\Z)",
    re.S,
)


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
        spans = [(h.start, h.end) for h in hits]
        for m in _FUNCTION.finditer(text):
            if any(a <= m.start() < b for a, b in spans):
                continue
            close = _FUNCTION_CLOSE.search(text, m.end())
            if close is None and not final:
                hits.append(Hit(m.start(), len(text), complete=False))
                break
            end = close.end() if close else len(text)
            after = _CLOSE.match(text, end) or re.compile(r"\s*</tool_call\s*>").match(text, end)
            block_end = after.end() if after else end
            hits.extend(_qwen(text[m.start() : end], m.start(), block_end, ctx))
    return hits


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
    for fm in _FUNCTION.finditer(body):
        name = fm.group(1).strip()
        if not fm.group(2) or not name:
            hits.append(Hit(start, end, bad_reason="<function= without a closing '>' after the name", keep_text=True))
            continue
        fclose = _FUNCTION_CLOSE.search(body, fm.end())
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
    for am in _ARG.finditer(body):
        key = am.group(1).strip()
        args[key] = coerce_parameter(_strip_value(am.group(2)), props.get(key))
    return Hit(start, end, RawCall(name, dumps(args)))
