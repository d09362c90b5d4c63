"""MiroFlow's ``<use_mcp_tool>`` text protocol, the engine's own.

    <use_mcp_tool>
    <server_name>tool-python</server_name>
    <tool_name>run_python</tool_name>
    <arguments>
    {"code": "print(1)"}
    </arguments>
    </use_mcp_tool>

Lenient about case, attributes and whitespace in the tags. A block cut off by the end of the reply (no
``</arguments>``, no ``</use_mcp_tool>``) is mended once the reply is complete; while streaming it waits. The
arguments are passed on as written: ``repair_arguments`` reads them. When they are valid JSON, a closing tag
inside one of their strings (``{"html": "</arguments>"}``) is content: the block ends after the JSON value.
"""

from __future__ import annotations

import re

from flowllm.parsing.repair.stages import BracketMatcher, loads_strict
from flowllm.parsing.toolcalls.base import Context, Hit, RawCall

MARKER = "<use_mcp_tool"
# Attributes never hold '<': stopping there keeps a run of '<use_mcp_tool ' without '>' linear.
_OPEN = re.compile(r"<use_mcp_tool\b[^<>]*>", re.I)
_CLOSE = re.compile(r"</use_mcp_tool\s*>", re.I)


def _field(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<{tag}\b[^<>]*>(.*?)(?:</{tag}\s*>|(?=<[a-z_]+\b[^<>]*>)|\Z)", re.I | re.S)


_SERVER = _field("server_name")
_TOOL = _field("tool_name")
_ARGS_OPEN = re.compile(r"<arguments\b[^<>]*>", re.I)
_ARGS_CLOSE = re.compile(r"</arguments\s*>", re.I)


_UNCLOSED, _INVALID = -2, -3
_FENCE_OPEN = re.compile(r"`{3,}[ \t]*[A-Za-z0-9_+.-]*[ \t]*\n")


def scan(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    brackets = BracketMatcher(text)
    pos = 0
    while True:
        m = _OPEN.search(text, pos)
        if m is None:
            break
        body_start = m.end()
        nxt = _OPEN.search(text, body_start)
        limit = nxt.start() if nxt else len(text)
        args_open = _ARGS_OPEN.search(text, body_start, limit)
        json_end = _json_arguments_end(text, args_open, brackets) if args_open else -1
        if json_end > limit:  # the next <use_mcp_tool is inside a string of these arguments
            nxt = _OPEN.search(text, json_end)
            limit = nxt.start() if nxt else len(text)
        # Past valid JSON arguments a closing tag is markup; inside them it is a string's content.
        close = _CLOSE.search(text, json_end if json_end > 0 else body_start, limit)
        # JSON arguments still open while streaming: a close tag seen so far may be inside one of their
        # strings. (Arguments that never close are read when the reply ends.)
        complete = (close is not None or nxt is not None) and json_end != _UNCLOSED
        end = close.end() if close else limit
        pos = max(end, body_start)
        if not complete and not final:
            hits.append(Hit(m.start(), end, complete=False))
            continue
        body_end = close.start() if close else limit
        hits.append(_read_block(text, body_start, body_end, args_open, json_end, m.start(), end))
    return hits


def _json_arguments_end(text: str, args_open: re.Match[str], brackets: BracketMatcher) -> int:
    """Where the arguments' JSON value ends, when it is valid JSON; else -1 (the first close tag ends it), or
    ``_UNCLOSED`` when its brackets or a string never close, ``_INVALID`` when the value is other broken JSON."""
    j = _skip_space(text, args_open.end())
    fence = _FENCE_OPEN.match(text, j)
    if fence is not None:  # ```json fenced arguments
        j = _skip_space(text, fence.end())
    if j >= len(text) or text[j] not in "{[":
        return -1
    end = brackets.end(j)
    if end < 0:
        return _UNCLOSED
    try:
        loads_strict(text[j:end])
    except ValueError:
        if brackets.open_string(j):
            return _UNCLOSED  # a string still open: while streaming, its close tags may be content
        return _INVALID  # broken JSON: its brackets cannot be trusted to say where its strings are
    return end


def _skip_space(text: str, j: int) -> int:
    while j < len(text) and text[j].isspace():
        j += 1
    return j


def _read_block(
    text: str, start: int, end: int, args_open: re.Match[str] | None, json_end: int, hit_start: int, hit_end: int
) -> Hit:
    head = text[start : args_open.start() if args_open else end]
    tool = _TOOL.search(head)
    server = _SERVER.search(head)
    name = tool.group(1).strip() if tool else ""
    if not name:
        return Hit(hit_start, hit_end, bad_reason="<use_mcp_tool> block without a <tool_name>", keep_text=True)
    if args_open is None:
        arguments = ""  # no <arguments> at all: a tool that takes none
    else:
        args_close = _ARGS_CLOSE.search(text, json_end if json_end > 0 else args_open.end(), end)
        arguments = text[args_open.end() : args_close.start() if args_close else end].strip()
    server_name = server.group(1).strip() if server else None
    return Hit(hit_start, hit_end, RawCall(name, arguments, server_name or None))
