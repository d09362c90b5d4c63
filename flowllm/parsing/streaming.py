"""Tool calls from a reply that arrives chunk by chunk.

    parser = StreamingToolCallParser(servers=..., formats=..., tools=...)
    for chunk in stream:
        for call in parser.feed(chunk):   # each call once, as soon as its block is complete
            ...
    parsed = parser.finish()              # the same Parsed that parse_tool_calls gives for the whole text

Each ``feed`` re-reads the text received so far (a reply is a few kilobytes, so this costs microseconds and
keeps one parser for both modes). A block is complete when its closing marker has arrived (or, for JSON, its
closing bracket); an unfinished block waits, and is mended only by ``finish``. Ids are the same as the
one-shot parser's, so a streamed reply and a saved one replay identically.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from flowllm.parsing.toolcalls import FORMATS, build_parsed, scan_text
from flowllm.parsing.toolcalls.base import Context
from flowllm.parsing.types import BadToolCall, Parsed, ToolCall


class StreamingToolCallParser:
    def __init__(
        self,
        servers: Iterable[str] | None = None,
        formats: Sequence[str] | None = None,
        tools: Any = None,
    ) -> None:
        self._ctx = Context.build(servers, tools)
        self._enabled = frozenset(FORMATS if formats is None else formats)
        self._buffer: list[str] = []
        self._text = ""
        self._emitted: list[ToolCall] = []
        self._bad_seen = 0
        self.bad: list[BadToolCall] = []

    @property
    def text(self) -> str:
        return self._text

    def feed(self, chunk: str) -> list[ToolCall]:
        """Add a chunk; return the calls completed by it (never one twice)."""
        if not chunk:
            return []
        self._text += chunk
        hits, used = scan_text(self._text, self._ctx, self._enabled, final=False)
        # Only the prefix of hits up to the first unfinished block is settled.
        settled = []
        for h in hits:
            if not h.complete:
                break
            settled.append(h)
        parsed = build_parsed(self._text, settled, self._ctx, used)
        new = parsed.calls[len(self._emitted) :]
        self._emitted.extend(new)
        if len(parsed.bad) > self._bad_seen:
            self.bad.extend(parsed.bad[self._bad_seen :])
            self._bad_seen = len(parsed.bad)
        return new

    def finish(self) -> Parsed:
        """The reply is complete: mend what was cut off and return the full result."""
        hits, used = scan_text(self._text, self._ctx, self._enabled, final=True)
        parsed = build_parsed(self._text, hits, self._ctx, used)
        # Calls already handed out stay as they were: the consumer may have started them.
        n = len(self._emitted)
        if parsed.calls[:n] != self._emitted:
            parsed.calls = self._emitted + parsed.calls[n:]
        return parsed
