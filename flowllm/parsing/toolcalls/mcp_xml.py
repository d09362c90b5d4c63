"""MiroFlow's ``<use_mcp_tool>`` text protocol, the engine's own (DESIGN.md section 4).

    <use_mcp_tool>
    <server_name>tool-python</server_name>
    <tool_name>run_python</tool_name>
    <arguments>
    {"code": "print(1)"}
    </arguments>
    </use_mcp_tool>

Lenient about case, attributes and whitespace in the tags. A block cut off by the end of the reply (no
``</arguments>``, no ``</use_mcp_tool>``) is mended once the reply is complete; while streaming it waits. The
arguments are passed on as written: ``repair_arguments`` reads them.
"""

from __future__ import annotations

import re

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


def scan(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    opens = list(_OPEN.finditer(text))
    for idx, m in enumerate(opens):
        limit = opens[idx + 1].start() if idx + 1 < len(opens) else len(text)
        close = _CLOSE.search(text, m.end(), limit)
        complete = close is not None or idx + 1 < len(opens)
        end = close.end() if close else limit
        if not complete and not final:
            hits.append(Hit(m.start(), end, complete=False))
            continue
        body = text[m.end() : close.start() if close else limit]
        hits.append(_read_block(body, m.start(), end))
    return hits


def _read_block(body: str, start: int, end: int) -> Hit:
    args_open = _ARGS_OPEN.search(body)
    head = body[: args_open.start()] if args_open else body
    tool = _TOOL.search(head)
    server = _SERVER.search(head)
    name = tool.group(1).strip() if tool else ""
    if not name:
        return Hit(start, end, bad_reason="<use_mcp_tool> block without a <tool_name>", keep_text=True)
    if args_open is None:
        arguments = ""  # no <arguments> at all: a tool that takes none
    else:
        args_close = _ARGS_CLOSE.search(body, args_open.end())
        arguments = body[args_open.end() : args_close.start() if args_close else len(body)].strip()
    server_name = server.group(1).strip() if server else None
    return Hit(start, end, RawCall(name, arguments, server_name or None))
