"""The contamination guard: web search results, pages and downloads from benchmark answer sources are kept from
the model.

The denylist is ``tools.web.block`` (defaults: flowllm/config/answer_sources.py), handed to the web tool servers
as JSON in ``$FLOWLLM_WEB_BLOCK`` (flowllm/setup/webconf.py); a server started without it uses the defaults. An
entry ``host[/path]`` matches the host and its subdomains and the path and what lies below it, without case. A
fixture host ``<real host>.web.test`` (flowllm/emulator/web.py) stands for the real host it names, so the
offline fixture's copy of a dataset page is refused like the page itself.

tool-search drops a blocked result and says how many it withheld; read_url, find_in_url and every redirect hop
of a fetch are refused with a message saying the source is a benchmark answer source. Either way the tool
result carries ``structuredContent`` ``{"contamination": {...}}`` (``Block.record``): the run's audit counts
them into ``summary.json → contamination`` (flowllm/export/contamination.py).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from flowllm.config.answer_sources import DEFAULT_BLOCK
from flowllm.emulator.web import FIXTURE_DOMAIN

BLOCK_ENV = "FLOWLLM_WEB_BLOCK"
RECORD_KEY = "contamination"  # the key of a block's record in a tool result's structured content
REFUSAL = "is a benchmark answer source"  # in every refusal and withheld line: how a saved text tells of a block
_TOLD = re.compile(r"^(?:refused|withheld): (\S+) " + REFUSAL + r".*?entry '([^']*)'", re.MULTILINE)


@dataclass(frozen=True)
class Rule:
    """One denylist entry: a host (and its subdomains) and a path prefix ("" for the whole host)."""

    entry: str
    host: str
    path: str

    @classmethod
    def parse(cls, entry: str) -> Rule:
        text = entry.strip().lower()
        if "://" in text:
            text = text.split("://", 1)[1]
        host, _, path = text.partition("/")
        host = host.rstrip(".")
        if not host:
            raise ValueError(f"tools.web.block: {entry!r} names no host (write host or host/path)")
        return cls(entry.strip(), host, "/" + path.strip("/") if path.strip("/") else "")

    def matches(self, host: str, path: str) -> bool:
        if host != self.host and not host.endswith("." + self.host):
            return False
        return not self.path or path == self.path or path.startswith(self.path + "/")


def real_host(host: str) -> str:
    """The host a URL stands for: a fixture host ``<real host>.web.test`` is that real host."""
    host = host.lower().rstrip(".")
    suffix = "." + FIXTURE_DOMAIN
    if host.endswith(suffix) and "." in host[: -len(suffix)]:
        return host[: -len(suffix)]
    return host


@dataclass(frozen=True)
class Block:
    """A URL the guard kept from the model, and the entry that matched it."""

    url: str
    rule: str

    def message(self) -> str:
        """What read_url answers for a blocked URL."""
        return (
            f"refused: {self.url} {REFUSAL} (its answers must not be looked up; tools.web.block entry "
            f"'{self.rule}'): find the answer from other sources"
        )

    def withheld(self) -> str:
        """The line a search answer carries for a result it dropped."""
        return f"withheld: {self.url} {REFUSAL} (tools.web.block entry '{self.rule}')"

    @staticmethod
    def record(tool: str, blocks: Iterable[Block]) -> dict[str, object]:
        """The structured content a tool result carries for its blocks."""
        return {RECORD_KEY: {"tool": tool, "blocked": [{"url": b.url, "rule": b.rule} for b in blocks]}}

    @classmethod
    def told_in(cls, text: str) -> list[Block]:
        """The blocks a tool's text tells of (a refusal, a search's withheld lines), cached or fresh."""
        return [cls(m.group(1), m.group(2)) for m in _TOLD.finditer(text)]


class BlockedSource(Exception):
    """A fetch refused by the guard; the message is what the model is told."""

    def __init__(self, block: Block) -> None:
        super().__init__(block.message())
        self.block = block


@dataclass(frozen=True)
class Guard:
    rules: tuple[Rule, ...]

    @classmethod
    def of(cls, entries: Iterable[str]) -> Guard:
        return cls(tuple(Rule.parse(e) for e in entries if str(e).strip()))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Guard:
        """The run's denylist (``$FLOWLLM_WEB_BLOCK``, a JSON list), else the defaults."""
        raw = (os.environ if environ is None else environ).get(BLOCK_ENV)
        if raw is None:
            return cls.of(DEFAULT_BLOCK)
        entries = json.loads(raw)
        if not isinstance(entries, list):
            raise ValueError(f"${BLOCK_ENV} must be a JSON list of host/path entries")
        return cls.of(str(e) for e in entries)

    def match(self, url: str) -> Block | None:
        parts = urlsplit(url.strip())
        host = real_host(parts.hostname or "")
        path = (parts.path or "/").lower().rstrip("/") or "/"
        rule = next((r for r in self.rules if r.matches(host, path)), None)
        return None if rule is None else Block(url.strip(), rule.entry)

    def split(self, urls: Iterable[str]) -> tuple[list[int], list[Block]]:
        """The positions of the URLs kept, and the blocks of those dropped."""
        kept: list[int] = []
        blocks: list[Block] = []
        for n, url in enumerate(urls):
            block = self.match(url)
            if block is None:
                kept.append(n)
            else:
                blocks.append(block)
        return kept, blocks

    def check(self, url: str) -> None:
        """Raises ``BlockedSource`` for a URL from a benchmark answer source."""
        block = self.match(url)
        if block is not None:
            raise BlockedSource(block)


def env_value(entries: Iterable[str]) -> str:
    """``$FLOWLLM_WEB_BLOCK`` for a denylist (each entry checked first: a bad one is one line)."""
    listed = [str(e) for e in entries]
    Guard.of(listed)
    return json.dumps(listed)
