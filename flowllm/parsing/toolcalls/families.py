"""Formats of four open model families, as their chat templates (and llama.cpp's parsers) write them.

* ``minimax_m2``: ``<minimax:tool_call><invoke name="NAME"><parameter name="KEY">value</parameter>...</invoke>
  </minimax:tool_call>``; several invokes in one block. Values are text, typed by the tool's schema.
* ``harmony`` (gpt-oss): ``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>``,
  also with the recipient after the channel (``<|channel|>commentary to=functions.NAME <|constrain|>json
  <|message|>{...}``) and without ``<|start|>assistant`` (the generation prompt wrote it).
* ``functionary`` (v3.2): ``>>>NAME\\n{...}``, once per call; ``>>>all\\n`` starts plain text. A REPL prompt
  (``>>> x``, with a space) is not a call. The reply's first call may lack its ``>>>`` (the generation prompt
  wrote it): ``NAME\\n{...}`` at the very start, for a tool the request offered.
* ``gemma4``: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:5,flag:true,obj:{...},list:[...]}<tool_call|>``:
  bare keys, strings between ``<|"|>`` marks, other values as written.
"""

from __future__ import annotations

import re
from typing import Any

from flowllm.parsing.toolcalls.base import (
    Context,
    Hit,
    RawCall,
    coerce_parameter,
    dumps,
    schema_for,
    split_server,
)

# ----- MiniMax-M2 -----------------------------------------------------------------------------------------
MINIMAX = "<minimax:tool_call>"
_MINIMAX_CLOSE = "</minimax:tool_call>"
_INVOKE = re.compile(r"<invoke\s+name\s*=\s*\"([^\"]*)\"\s*>|<invoke\s+name\s*=\s*'([^']*)'\s*>")
_INVOKE_CLOSE = "</invoke>"
_PARAM = re.compile(r"<parameter\s+name\s*=\s*[\"']([^\"']*)[\"']\s*>")
_PARAM_CLOSE = "</parameter>"


class _Next:
    """The first match of ``pattern`` at or after a position, for positions that only grow: one search serves
    every position up to the match it found (and a search that found nothing, every later one), so a text of
    many openers and no closer is scanned once, not once per opener."""

    __slots__ = ("_found", "_from", "_pattern", "_text")

    def __init__(self, pattern: re.Pattern[str], text: str) -> None:
        self._pattern, self._text = pattern, text
        self._from = -1
        self._found: re.Match[str] | None = None

    def at(self, pos: int) -> int:
        """Where the next match starts (-1: none)."""
        found = self.after(pos)
        return found.start() if found else -1

    def after(self, pos: int) -> re.Match[str] | None:
        if self._from >= 0 and pos >= self._from and (self._found is None or self._found.start() >= pos):
            return self._found
        self._from = pos
        self._found = self._pattern.search(self._text, pos)
        return self._found


def scan_minimax(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    closes = _Next(re.compile(re.escape(_MINIMAX_CLOSE)), text)
    pos = text.find(MINIMAX)
    while pos >= 0:
        body_start = pos + len(MINIMAX)
        close = closes.at(body_start)
        if close < 0 and not final:
            hits.append(Hit(pos, len(text), complete=False))
            break
        nxt = text.find(MINIMAX, body_start)
        body_end = close if close >= 0 and (nxt < 0 or close < nxt) else (nxt if nxt >= 0 else len(text))
        end = body_end + len(_MINIMAX_CLOSE) if body_end == close else body_end
        found = _minimax_invokes(text[body_start:body_end], pos, end, ctx)
        hits.extend(
            found or [Hit(pos, end, bad_reason="<minimax:tool_call> holds no <invoke name=...>", keep_text=True)]
        )
        pos = text.find(MINIMAX, end)
    return hits


_INVOKE_CLOSE_RE = re.compile(re.escape(_INVOKE_CLOSE))
_PARAM_CLOSE_RE = re.compile(re.escape(_PARAM_CLOSE))


def _minimax_invokes(body: str, start: int, end: int, ctx: Context) -> list[Hit]:
    hits: list[Hit] = []
    invokes = list(_INVOKE.finditer(body))
    closes = _Next(_INVOKE_CLOSE_RE, body)
    params = _Next(_PARAM, body)
    param_closes = _Next(_PARAM_CLOSE_RE, body)
    for i, m in enumerate(invokes):
        name = (m.group(1) if m.group(1) is not None else m.group(2) or "").strip()
        if not name:
            hits.append(Hit(start, end, bad_reason="<invoke> without a name", keep_text=True))
            continue
        limit = invokes[i + 1].start() if i + 1 < len(invokes) else len(body)
        close = closes.at(m.end())
        if 0 <= close < limit:
            limit = close
        props = schema_for(ctx, name)
        args: dict[str, Any] = {}
        pm = params.after(m.end())
        while pm is not None and pm.start() < limit:
            following = params.after(pm.end())
            vend = param_closes.at(pm.end())
            stop = min(following.start() if following is not None else limit, limit)
            if vend < 0 or vend > stop:
                vend = stop
            args[pm.group(1).strip()] = coerce_parameter(body[pm.end() : vend].strip(), props.get(pm.group(1).strip()))
            pm = following
        hits.append(Hit(start, end, RawCall(name, dumps(args))))
    return hits


# ----- gpt-oss harmony ------------------------------------------------------------------------------------
HARMONY = "to=functions."
_HARMONY_CALL = re.compile(
    r"(?:<\|start\|>\s*assistant\s*)?(?:<\|channel\|>\s*\w+\s*)?to=functions\.([^\s<]+)\s*"
    r"(?:<\|channel\|>\s*\w+\s*)?(?:<\|constrain\|>\s*)?(?:[\w/.-]+\s*)?<\|message\|>"
)
_HARMONY_END = re.compile(r"<\|call\|>|<\|end\|>|<\|return\|>|(?=<\|start\|>)")


def scan_harmony(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    pos = 0
    ends = _Next(_HARMONY_END, text)
    while True:
        m = _HARMONY_CALL.search(text, pos)
        if m is None:
            break
        end_m = ends.after(m.end())
        if end_m is None and not final:
            hits.append(Hit(m.start(), len(text), complete=False))
            break
        args_end = end_m.start() if end_m else len(text)
        end = end_m.end() if end_m else len(text)
        hits.append(Hit(m.start(), end, RawCall(m.group(1).strip(), text[m.end() : args_end].strip())))
        pos = max(end, m.end())
    return hits


# ----- functionary v3.2 -----------------------------------------------------------------------------------
FUNCTIONARY = ">>>"
# No line start required: the template writes ">>>all\n" + text and then ">>>name" right after the text.
_FUNCTIONARY_CALL = re.compile(r"(?<!>)>>>([A-Za-z_][\w.\-]*)[ \t]*\n")


# The first call of a reply has no ">>>": the generation prompt ends with it, so the model starts with the name.
_FUNCTIONARY_LEAD = re.compile(r"\s*([A-Za-z_][\w.\-]*)[ \t]*\n\s*(?=\{)")


def functionary_lead(text: str, ctx: Context, final: bool, end: int | None = None) -> Hit | None:
    """The reply's first functionary call when it starts with the bare ``NAME\\n{...}`` (its ``>>>`` was
    the generation prompt's), up to ``end``. Only a tool the request offered counts: a word on a line of its
    own before a JSON object is otherwise ordinary text."""
    m = _FUNCTIONARY_LEAD.match(text, 0, len(text) if end is None else end)
    if m is None or ctx.known_tools is None:
        return None
    name = m.group(1)
    if name not in ctx.known_tools and split_server(name, ctx, native=False)[1] not in ctx.known_tools:
        return None
    stop = len(text) if end is None else end
    body = text[m.end() : stop].strip()
    if not final and stop == len(text) and not _balanced(body):
        return Hit(0, stop, complete=False)
    return Hit(0, stop, RawCall(name, body))  # a cut object is completed by repair, like the marked form


def scan_functionary(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    heads = list(_FUNCTIONARY_CALL.finditer(text))
    lead = functionary_lead(text, ctx, final, heads[0].start() if heads else None)
    if lead is not None:
        hits.append(lead)
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        name = m.group(1)
        if name == "all":  # ">>>all" starts text for the user: only the marker is syntax
            hits.append(Hit(m.start(), m.end()))
            continue
        body = text[m.end() : end]
        if not body.strip() and not final and end == len(text):
            hits.append(Hit(m.start(), end, complete=False))
            break
        stripped = body.strip()
        if not stripped.startswith("{"):
            reason = f"functionary call to {name!r}: its arguments are not a JSON object"
            hits.append(Hit(m.start(), end, bad_reason=reason, keep_text=True))
            continue
        if not final and end == len(text) and not _balanced(stripped):
            hits.append(Hit(m.start(), end, complete=False))
            break
        hits.append(Hit(m.start(), end, RawCall(name, stripped)))
    return hits


def _balanced(text: str) -> bool:
    from flowllm.parsing.repair.stages import balanced_end

    return balanced_end(text, 0) == len(text)


# ----- gemma-4 --------------------------------------------------------------------------------------------
GEMMA = "<|tool_call>"
_GEMMA_CLOSE = "<tool_call|>"
_GEMMA_QUOTE = '<|"|>'
_GEMMA_HEAD = re.compile(r"<\|tool_call>\s*call:\s*([^\s{<]+)\s*")


def scan_gemma(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    pos = text.find(GEMMA)
    while pos >= 0:
        close = text.find(_GEMMA_CLOSE, pos + len(GEMMA))
        nxt = text.find(GEMMA, pos + len(GEMMA))
        if close < 0 or (0 <= nxt < close):
            if not final:
                hits.append(Hit(pos, len(text), complete=False))
                break
            end = nxt if nxt >= 0 else len(text)
            body_end = end
        else:
            end = close + len(_GEMMA_CLOSE)
            body_end = close
        head = _GEMMA_HEAD.match(text, pos)
        if head is None:
            hits.append(Hit(pos, end, bad_reason="<|tool_call> without call:NAME", keep_text=True))
        else:
            name = head.group(1)
            try:
                value, _ = _GemmaReader(text[head.end() : body_end]).value(0)
            except ValueError as exc:
                hits.append(Hit(pos, end, bad_reason=f"gemma tool call {name!r}: {exc}", keep_text=True))
            else:
                if isinstance(value, dict):
                    props = schema_for(ctx, name)
                    args = {k: _typed(v, props.get(k)) for k, v in value.items()}
                    hits.append(Hit(pos, end, RawCall(name, dumps(args))))
                else:
                    reason = f"gemma tool call {name!r}: its arguments are not an object"
                    hits.append(Hit(pos, end, bad_reason=reason, keep_text=True))
        pos = text.find(GEMMA, end) if end > pos else -1
    return hits


def _typed(value: Any, prop: Any) -> Any:
    """A bare value (kept as text by the reader) typed by the schema; quoted strings stay strings."""
    if isinstance(value, _Bare):
        return coerce_parameter(str(value), prop)
    if isinstance(value, dict):
        return {k: _typed(v, None) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v, None) for v in value]
    return value


class _Bare(str):
    """A value written without quote marks (a number, true, None...): its type is decided afterwards."""


class _GemmaReader:
    """A reader for gemma-4's argument syntax; linear, an explicit stack depth bound, ValueError on bad input."""

    MAX_DEPTH = 200

    def __init__(self, text: str) -> None:
        self.text = text

    def _skip(self, i: int) -> int:
        while i < len(self.text) and self.text[i] in " \t\r\n":
            i += 1
        return i

    def value(self, i: int, depth: int = 0) -> tuple[Any, int]:
        if depth > self.MAX_DEPTH:
            raise ValueError("arguments nested too deep")
        t = self.text
        i = self._skip(i)
        if t.startswith(_GEMMA_QUOTE, i):
            close = t.find(_GEMMA_QUOTE, i + len(_GEMMA_QUOTE))
            if close < 0:  # cut off: the string runs to the end
                return t[i + len(_GEMMA_QUOTE) :], len(t)
            return t[i + len(_GEMMA_QUOTE) : close], close + len(_GEMMA_QUOTE)
        if i < len(t) and t[i] == "{":
            return self._object(i + 1, depth)
        if i < len(t) and t[i] == "[":
            return self._list(i + 1, depth)
        j = i
        while j < len(t) and t[j] not in ",}]":
            j += 1
        word = t[i:j].strip()
        if not word:
            raise ValueError(f"a value is missing at character {i}")
        return _Bare(word), j

    def _object(self, i: int, depth: int) -> tuple[dict[str, Any], int]:
        t = self.text
        out: dict[str, Any] = {}
        while True:
            i = self._skip(i)
            if i >= len(t):
                return out, i  # cut off: what was read so far
            if t[i] == "}":
                return out, i + 1
            if t[i] == ",":
                i += 1
                continue
            if t.startswith(_GEMMA_QUOTE, i):
                key, i = self.value(i, depth + 1)
            else:
                colon = t.find(":", i)
                if colon < 0:
                    raise ValueError(f"a key without ':' at character {i}")
                key, i = t[i:colon], colon
            i = self._skip(i)
            if i >= len(t) or t[i] != ":":
                raise ValueError(f"':' expected after the key {str(key)[:40]!r}")
            value, i = self.value(i + 1, depth + 1)
            out[str(key).strip()] = value

    def _list(self, i: int, depth: int) -> tuple[list[Any], int]:
        t = self.text
        out: list[Any] = []
        while True:
            i = self._skip(i)
            if i >= len(t):
                return out, i
            if t[i] == "]":
                return out, i + 1
            if t[i] == ",":
                i += 1
                continue
            value, i = self.value(i, depth + 1)
            out.append(value)
