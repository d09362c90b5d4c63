"""The value of a string the lenient parser has delimited: JSON escapes decoded (anything else kept as written),
layout before a closing quote dropped, and a fenced JSON block inside a string read as the JSON it holds.
"""

from __future__ import annotations

import json
import re
from typing import Any

_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|(.))", re.S)
_SURROGATE = re.compile("[\ud800-\udfff]")
_SIMPLE_ESCAPES = {
    '"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "'": "'",
    "\u201c": "\u201c", "\u201d": "\u201d", "\u201e": "\u201e", "\u2018": "\u2018", "\u2019": "\u2019", "`": "`",
}  # fmt: skip
_FENCED_JSON = re.compile(r"```[a-zA-Z0-9]*\s*(.*?)\s*```\s*\Z", re.S)


def _unescape(match: re.Match[str]) -> str:
    hexa, char = match.group(1), match.group(2)
    if hexa is not None:
        return chr(int(hexa, 16))
    mapped = _SIMPLE_ESCAPES.get(char)
    # An unknown escape keeps its backslash: a Windows path or a regex means exactly what it says.
    return mapped if mapped is not None else "\\" + char


def decode_string(raw: str) -> str:
    """The value of a string's raw content: JSON escapes decoded, anything else kept as written."""
    if "\\" not in raw:
        return raw
    run = len(raw) - len(raw.rstrip("\\"))
    if run % 2:  # a lone trailing backslash is an escape that was cut off
        raw = raw[:-1]
    out = _ESCAPE.sub(_unescape, raw)
    if _SURROGATE.search(out):  # \ud83d\ude00 pairs arrive as two halves
        out = out.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return out


def string_value(raw: str, key: bool, code: bool, terminated: bool) -> Any:
    """A string's value from its raw content (``key``: it is an object key; ``code``: a code field, kept exactly;
    ``terminated``: its closing quote was found): trailing layout dropped, escapes decoded, and JSON fenced in a
    string read as that JSON."""
    if not code:
        tail = raw[len(raw.rstrip()) :]
        if tail and ("\n" in tail or not terminated):
            raw = raw.rstrip()  # a raw line break before the closing quote is layout, not content
    value = decode_string(raw)
    if not key and not code and value.startswith("```"):
        m = _FENCED_JSON.match(value)
        if m is not None:
            try:
                inner = json.loads(m.group(1))
            except ValueError:
                pass
            else:
                if isinstance(inner, dict | list):
                    return inner
    return value
