"""Tool calls from a reply that arrives chunk by chunk.

    parser = StreamingToolCallParser(servers=..., formats=..., tools=...)
    for chunk in stream:
        for call in parser.feed(chunk):   # each call once, as soon as its block is complete
            ...
    parsed = parser.finish()              # the same Parsed that parse_tool_calls gives for the whole text

A ``feed`` re-reads the text received so far, which keeps one parser for both modes, but only when it can
matter: a block is complete when its closing marker has arrived (or, for JSON, its closing bracket), and
every such marker ends in ``>``, ``]``, ``}`` or ``)``, so a chunk without one settles nothing new. Past
``EAGER_CHARS`` the re-reads are spaced out geometrically (once the text has grown by an eighth since the
last one), so a long reply costs a bounded number of passes over its text in all, never one pass per chunk:
a call may then be handed out a little later, never lost (``finish`` reads everything). An unfinished block
waits, and is mended only by ``finish``. Ids are the same as the
one-shot parser's, so a streamed reply and a saved one replay identically.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from flowllm.parsing.safety import DEFAULT_MAX_CHARS, clip, failure_reason
from flowllm.parsing.toolcalls import FORMATS, build_parsed, parse_tool_calls, scan_text
from flowllm.parsing.toolcalls.base import Context
from flowllm.parsing.types import BadToolCall, Parsed, ToolCall

# Below this length every chunk that may close a block is re-read at once (cheap, and calls start soonest).
EAGER_CHARS = 2048
_CLOSERS = re.compile(r"[>\]})]")


class StreamingToolCallParser:
    def __init__(
        self,
        servers: Iterable[str] | None = None,
        formats: Sequence[str] | None = None,
        tools: Any = None,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        self._ctx = Context.build(servers, tools)
        self._max_chars = max_chars
        self._enabled = frozenset(FORMATS if formats is None else formats)
        self._parts: list[str] = []
        self._length = 0
        self._scanned_at = 0  # the text's length at the last re-read
        self._pending = False  # a chunk since then may have closed a block
        self._emitted: list[ToolCall] = []
        self._bad_seen = 0
        # How many times, and how many characters in all, feed has re-read the text: the cost of streaming.
        self.passes = 0
        self.chars_read = 0
        self.bad: list[BadToolCall] = []

    @property
    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def feed(self, chunk: str) -> list[ToolCall]:
        """Add a chunk; return the calls completed by it (never one twice)."""
        if not chunk:
            return []
        self._parts.append(chunk)
        self._length += len(chunk)
        if not self._pending and _CLOSERS.search(chunk) is not None:
            self._pending = True
        if not self._pending or self._length > self._max_chars:
            return []  # over the limit, finish reports it
        if self._length > EAGER_CHARS and self._length - self._scanned_at < self._length // 8:
            return []  # settled at a later chunk, or by finish
        self._pending = False
        self._scanned_at = self._length
        self.passes += 1
        self.chars_read += self._length
        text = self.text
        try:
            hits, used = scan_text(text, self._ctx, self._enabled, final=False)
            # Only the prefix of hits up to the first unfinished block is settled.
            settled = []
            for h in hits:
                if not h.complete:
                    break
                settled.append(h)
            parsed = build_parsed(text, settled, self._ctx, used)
        except Exception:  # finish reads the whole reply again and reports what cannot be read
            return []
        new = parsed.calls[len(self._emitted) :]
        self._emitted.extend(new)
        if len(parsed.bad) > self._bad_seen:
            self.bad.extend(parsed.bad[self._bad_seen :])
            self._bad_seen = len(parsed.bad)
        return new

    def finish(self) -> Parsed:
        """The reply is complete: mend what was cut off and return the full result."""
        text = self.text
        if len(text) > self._max_chars:
            parsed = parse_tool_calls(text, max_chars=self._max_chars)  # the same bad call, said the same way
        else:
            try:
                hits, used = scan_text(text, self._ctx, self._enabled, final=True)
                parsed = build_parsed(text, hits, self._ctx, used)
            except Exception as exc:  # as parse_tool_calls: the reply's shape never fails the task
                parsed = Parsed([], [BadToolCall(f"the reply could not be parsed: {failure_reason(exc)}", clip(text))])
        # Calls already handed out stay as they were: the consumer may have started them.
        n = len(self._emitted)
        if parsed.calls[:n] != self._emitted:
            parsed.calls = self._emitted + parsed.calls[n:]
        return parsed
