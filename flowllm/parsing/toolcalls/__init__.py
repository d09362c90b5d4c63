"""Tool calls out of a model reply, whatever form they arrive in.

    parse_tool_calls(payload, servers=None, formats=None, tools=None) -> Parsed(calls, bad, content, formats)

``payload`` is model text, an OpenAI Chat ``tool_calls`` list (dicts or SDK objects), a Responses
``function_call`` item / output list / response, Anthropic ``tool_use`` blocks, or a ``ModelResponse`` (its
native calls when it has any, else its text). ``formats`` restricts text parsing to some of ``FORMATS``
(None: detect). ``tools`` (ToolSpecs, or a mapping of tool name to input schema) types the values of XML
formats and turns calls to unknown tools into bad calls.

Text formats with a marker of their own are tried first; the markerless ones (pythonic lists, plain JSON)
only when none of those found anything. Calls parsed from text are numbered ``call_0``, ``call_1``, ... in
order of appearance, so the same text always gives the same output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any

from flowllm.core.types import ModelResponse
from flowllm.errors import ConfigError
from flowllm.parsing.safety import (
    DEFAULT_MAX_CHARS,
    MAX_CALL_BLOCKS,
    clip,
    failure_reason,
    too_long_reason,
    too_many_blocks_reason,
)
from flowllm.parsing.toolcalls import families, markerless, mcp_xml, special, tagged
from flowllm.parsing.toolcalls.base import Context, Hit, RawCall, split_server
from flowllm.parsing.toolcalls.native import native_item, native_items
from flowllm.parsing.types import BadToolCall, Parsed, ToolCall

Scanner = Callable[[str, Context, bool, frozenset[str]], list[Hit]]

# name -> (scanner, markers that must appear in the text for it to run; empty: markerless)
_TEXT_FORMATS: dict[str, tuple[Scanner, tuple[str, ...]]] = {
    "mcp_xml": (lambda t, c, f, fm: mcp_xml.scan(t, c, f), (mcp_xml.MARKER,)),
    "kimi_k2": (lambda t, c, f, fm: special.scan_kimi(t, c, f), special.KIMI_MARKERS),
    "deepseek_v3": (lambda t, c, f, fm: special.scan_deepseek(t, c, f), special.DEEPSEEK_MARKERS),
    "mistral": (lambda t, c, f, fm: special.scan_mistral(t, c, f), (special.MISTRAL,)),
    "minimax_m2": (lambda t, c, f, fm: families.scan_minimax(t, c, f), (families.MINIMAX,)),
    "harmony": (lambda t, c, f, fm: families.scan_harmony(t, c, f), (families.HARMONY,)),
    "gemma4": (lambda t, c, f, fm: families.scan_gemma(t, c, f), (families.GEMMA,)),
    "functionary": (lambda t, c, f, fm: families.scan_functionary(t, c, f), (families.FUNCTIONARY,)),
    # One scanner reads every <tool_call> block and tells the three apart by content.
    "hermes": (tagged.scan, tagged.MARKERS),
    "qwen3_coder": (tagged.scan, tagged.MARKERS),
    "glm4": (tagged.scan, tagged.MARKERS),
    "pythonic": (lambda t, c, f, fm: markerless.scan_pythonic(t, c, f), ()),
    "json": (lambda t, c, f, fm: markerless.scan_json(t, c, f), ()),
}
_EMPTY_CONTEXT = Context()
NATIVE_FORMATS = ("openai_chat", "openai_responses", "anthropic")
FORMATS: tuple[str, ...] = (*_TEXT_FORMATS, *NATIVE_FORMATS)
_TAGGED = frozenset({"hermes", "qwen3_coder", "glm4"})


def validate_formats(formats: Sequence[str]) -> None:
    """Raise ``ValueError`` naming unknown format names and the valid ones."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ConfigError(f"unknown tool-call format(s) {', '.join(map(repr, unknown))}; valid: {', '.join(FORMATS)}")


_MCP_ANY_CASE = re.compile(re.escape(mcp_xml.MARKER), re.I)


def _marker_present(text: str, markers: tuple[str, ...]) -> bool:
    for m in markers:
        if m in text:
            return True
        if m is mcp_xml.MARKER and _MCP_ANY_CASE.search(text):  # <USE_MCP_TOOL> is fine too
            return True
    return False


@cache
def _marker_pattern(markers: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(map(re.escape, markers)), re.I)


def _block_cap(text: str, markers: tuple[str, ...]) -> int | None:
    """Where the block after the first ``MAX_CALL_BLOCKS`` of a format starts, or None when there are fewer."""
    if sum(text.count(m) for m in markers) <= MAX_CALL_BLOCKS and mcp_xml.MARKER not in markers:
        return None
    for n, m in enumerate(_marker_pattern(markers).finditer(text)):
        if n == MAX_CALL_BLOCKS:
            return m.start()
    return None


def _first_marker(text: str, markers: tuple[str, ...]) -> int:
    found = [p for p in (text.find(m) for m in markers) if p >= 0]
    return min(found, default=0)


@cache
def _plan(enabled: frozenset[str]) -> tuple[tuple[str, Scanner, tuple[str, ...]], ...]:
    """The scanners to run for a set of enabled formats, in priority order (the <tool_call> one once)."""
    plan = []
    tagged_done = False
    for name, (scanner, markers) in _TEXT_FORMATS.items():
        if name not in enabled:
            continue
        if name in _TAGGED:
            if tagged_done:
                continue
            tagged_done = True
        plan.append((name, scanner, markers))
    return tuple(plan)


def scan_text(text: str, ctx: Context, enabled: frozenset[str], final: bool) -> tuple[list[Hit], list[str]]:
    """All hits in ``text``, ordered and without overlaps, and the formats that produced them."""
    hits: list[Hit] = []
    used: list[str] = []
    labels: dict[int, str] = {}  # id(hit) -> the format that produced it
    marked_found = False
    for name, scanner, markers in _plan(enabled):
        if not markers:
            if marked_found:
                break
        elif not _marker_present(text, markers):
            continue
        cut = _block_cap(text, markers) if markers else None
        try:
            if cut is None:
                found = scanner(text, ctx, final, enabled)
            else:
                reason = too_many_blocks_reason(name, MAX_CALL_BLOCKS)
                found = [*scanner(text[:cut], ctx, final, enabled), Hit(cut, len(text), bad_reason=reason)]
        except Exception as exc:  # one format failing costs that format's calls, never the reply
            at = _first_marker(text, markers)
            found = [Hit(at, len(text), bad_reason=f"{name} tool call: {failure_reason(exc)}", keep_text=True)]
        label = name if name not in _TAGGED else "tagged"
        if hits:
            # A later format never claims text an earlier one has read, except a malformed block's: a call
            # read whole (a JSON call whose string mentions "<use_mcp_tool>") wins over a block that is only
            # a marker without its fields.
            strong = [o for o in hits if o.start != o.end and not _weak(o)]
            found = [h for h in found if not any(_overlap(h, o) for o in strong)]
            winners = [h for h in found if h.call is not None and h.complete]
            if winners:
                hits = [o for o in hits if not (_weak(o) and any(_overlap(o, w) for w in winners))]
            found = [h for h in found if h.call is not None or not any(_overlap(h, o) for o in hits)]
        if any(h.call or h.bad_reason or not h.complete for h in found):
            if markers and not all(_weak(h) for h in found if h.start != h.end):
                marked_found = True
            used.append(label)
        labels.update((id(h), label) for h in found)
        hits.extend(found)
    hits.sort(key=lambda h: (h.start, h.end))
    kept = {labels.get(id(h)) for h in hits if h.call or h.bad_reason or not h.complete}
    return hits, [u for u in used if u in kept]


def _weak(h: Hit) -> bool:
    return h.call is None and h.bad_reason is not None and h.keep_text


def _overlap(a: Hit, b: Hit) -> bool:
    return a.start < b.end and b.start < a.end and a.start != a.end and b.start != b.end


def build_parsed(text: str, hits: Iterable[Hit], ctx: Context, used: list[str], first_index: int = 0) -> Parsed:
    calls: list[ToolCall] = []
    bad: list[BadToolCall] = []
    pieces: list[str] = []
    cursor = 0
    index = first_index
    for h in hits:
        if not h.keep_text and h.start >= cursor:
            pieces.append(text[cursor : h.start])
            cursor = h.end
        elif not h.keep_text and h.end > cursor:
            cursor = h.end
        if h.call is not None:
            call = _finish_call(h.call, ctx, f"call_{index}", native=False)
            index += 1
            if isinstance(call, BadToolCall):
                call.raw = text[h.start : h.end]
                bad.append(call)
            else:
                calls.append(call)
        elif h.bad_reason is not None:
            bad.append(BadToolCall(h.bad_reason, text[h.start : h.end]))
    pieces.append(text[cursor:])
    return Parsed(calls, bad, "".join(pieces), used)


def _finish_call(raw: RawCall, ctx: Context, default_id: str, *, native: bool) -> ToolCall | BadToolCall:
    server = raw.server
    name = raw.name
    if server is None:
        server, name = split_server(name, ctx, native=native)
    if ctx.known_tools is not None and name not in ctx.known_tools and raw.name not in ctx.known_tools:
        return BadToolCall(f"unknown tool {name!r}; known tools: {', '.join(sorted(ctx.known_tools))}", "")
    return ToolCall(raw.id or default_id, server, name, raw.arguments_text)


def parse_tool_calls(
    payload: Any,
    servers: Iterable[str] | None = None,
    formats: Sequence[str] | None = None,
    tools: Any = None,
    max_chars: int | None = DEFAULT_MAX_CHARS,
) -> Parsed:
    """Every tool call in ``payload`` (see the module docstring). Never raises on malformed input.

    A text longer than ``max_chars`` (None: no limit) is not parsed: it comes back as one bad call saying so.
    Anything a scanner cannot read (nesting too deep, out of memory) is a bad call with the reason.
    """
    try:
        return _parse_tool_calls(payload, servers, formats, tools, max_chars)
    except Exception as exc:  # the last line of defence: a reply must never fail the task by its shape
        text = payload if isinstance(payload, str) else repr(payload)
        return Parsed([], [BadToolCall(f"the reply could not be parsed: {failure_reason(exc)}", clip(text))], "", [])


def _parse_tool_calls(
    payload: Any,
    servers: Iterable[str] | None,
    formats: Sequence[str] | None,
    tools: Any,
    max_chars: int | None,
) -> Parsed:
    ctx = _EMPTY_CONTEXT if servers is None and tools is None else Context.build(servers, tools)
    enabled = frozenset(FORMATS if formats is None else formats)
    if isinstance(payload, ModelResponse):
        if payload.tool_calls:
            parsed = _parse_native(payload.tool_calls, ctx)
            parsed.content = payload.text
            return parsed
        payload = payload.text
    if payload is None:
        return Parsed()
    if isinstance(payload, bytes | bytearray):
        payload = bytes(payload).decode("utf-8", "replace")
    if isinstance(payload, str):
        if max_chars is not None and len(payload) > max_chars:
            return Parsed([], [BadToolCall(too_long_reason(len(payload), max_chars), clip(payload))], payload, [])
        hits, used = scan_text(payload, ctx, enabled, final=True)
        return build_parsed(payload, hits, ctx, used)
    return _parse_native(payload, ctx)


def _parse_native(payload: Any, ctx: Context) -> Parsed:
    calls: list[ToolCall] = []
    bad: list[BadToolCall] = []
    for i, item in enumerate(native_items(payload)):
        try:
            raw, reason = native_item(item)
        except Exception as exc:  # arguments nested past what the encoder can write, and the like
            bad.append(BadToolCall(f"tool call could not be read: {failure_reason(exc)}", _safe_repr(item)))
            continue
        if raw is None:
            if reason:
                bad.append(BadToolCall(reason, _safe_repr(item)))
            continue
        if not raw.name:
            bad.append(BadToolCall("tool call without a name", _safe_repr(item)))
            continue
        call = _finish_call(raw, ctx, f"call_{i}", native=True)
        if isinstance(call, BadToolCall):
            call.raw = _safe_repr(item)
            bad.append(call)
        else:
            calls.append(call)
    return Parsed(calls, bad, "", ["native"] if calls or bad else [])


def _safe_repr(item: Any) -> str:
    try:
        return clip(repr(item))
    except Exception as exc:  # repr itself recurses on deep structures
        return f"<{type(item).__name__} that cannot be shown: {failure_reason(exc)}>"


__all__ = ["FORMATS", "parse_tool_calls", "scan_text", "validate_formats"]
