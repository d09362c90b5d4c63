"""The repair stages, one small function each, and the named chains ``conf/repair/*.yaml`` pick from.

A stage takes the current text (and the field name the text is the value of, if any) and returns one of:

* ``Found(value)``: the stage read the text; the chain stops and records this stage's name;
* a string: a rewritten text. The chain tries a strict parse of it at once (success is credited to this stage).
  If that fails, an *extracting* stage (``carries``) hands its text to the stages after it, while a *fixing*
  stage's rewrite is dropped, so a guess that did not work cannot mislead the stages that follow;
* ``None``: nothing for this stage to do.

Stages never raise on purpose; the chain still guards every call, so a bug in one stage costs that stage only.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import json5
import orjson

from flowllm.core.registry import Registry
from flowllm.parsing.pyliteral import parse_python_literal
from flowllm.parsing.repair.lenient import CODE_FIELDS, parse_lenient


@dataclass(frozen=True, slots=True)
class Found:
    value: Any


StageResult = Found | str | None
StageFn = Callable[[str, "str | None"], StageResult]


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    fn: StageFn
    carries: bool  # an unparsed rewrite goes on to the next stages (extraction), or is dropped (a fix attempt)
    summary: str


def _has_float(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is float:
            return True
        if t is dict:
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
    return False


def loads_strict(text: str) -> Any:
    """``json.loads`` semantics, with orjson's speed for the common case."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        # orjson refuses what Python's json accepts in a few corners (NaN, lone surrogates): json.loads has
        # the last word, so "strict" means exactly what the standard library means.
        return _loads_stdlib(text)
    if type(value) in (dict, list, float) and _has_float(value):
        # orjson reads integers beyond 64 bits as floats (losing digits); telling those from real floats would
        # cost more than letting the standard library read the (rare) documents that hold any float at all.
        return _loads_stdlib(text)
    return value


def _loads_stdlib(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError as exc:  # deeper than the interpreter's stack: as invalid as any other bad JSON
        raise ValueError("JSON nested too deeply to read") from exc


def _strict(text: str, key: str | None) -> StageResult:
    try:
        return Found(loads_strict(text))
    except (ValueError, RecursionError):
        return None


_FENCE_OPEN = re.compile(r"`{3,}[ \t]*[A-Za-z0-9_+.-]*[ \t]*\n?")
_FENCE_RUN = re.compile(r"`{3,}")


def fenced_blocks(s: str, at: int) -> tuple[list[str], str | None]:
    """The contents of the markdown fences from ``at`` on, and the content of a last one left open (or None).

    A fence holding a JSON value closes at the first fence *after* that value: a string inside it may hold a
    fence of its own (``{"readme": "```bash\\npip install x\\n```"}``), which the first fence found would
    cut in half. A value whose brackets do not balance is read to the last fence of the text.
    """
    blocks: list[str] = []
    n = len(s)
    while at >= 0:
        m = _FENCE_OPEN.match(s, at)
        if m is None:
            break
        body = m.end()
        j = body
        while j < n and s[j].isspace():
            j += 1
        search_from = body
        if j < n and s[j] in "{[":
            end = balanced_end(s, j)
            if end > 0:
                search_from = end
            else:
                last = s.rfind("```", body)
                search_from = last if last >= 0 else n
        close = _FENCE_RUN.search(s, search_from)
        if close is None:
            return blocks, s[body:].strip()
        blocks.append(s[body : close.start()].strip())
        at = s.find("```", close.end())
    return blocks, None


_DECODER = json.JSONDecoder()


def _fences(text: str, key: str | None) -> StageResult:
    """The value inside a markdown fence, or between the prose before and after it."""
    s = text.strip()
    if not s:
        return None
    if s[0] in "{[":
        # A complete value followed by prose or a stray bracket ('{"a": 1}\n}', '{"a": 1} Hope this helps'),
        # but not by a second value (',' or an opening bracket): several values are the structural stage's call.
        try:
            value, end = _DECODER.raw_decode(s)
        except ValueError:
            pass
        else:
            rest = s[end:].lstrip()
            if rest[:1] not in ("", ",", "{", "["):
                return Found(value)
    if s[0] in "{[" and s[-1] in "}]":
        return None
    fence_at = s.find("```")
    if fence_at >= 0 and "{" not in s[:fence_at] and "[" not in s[:fence_at]:
        blocks, unclosed = fenced_blocks(s, fence_at)
        blocks = [b for b in blocks if b[:1] in ("{", "[", "(")]
        if len(blocks) == 1:
            return blocks[0]
        if len(blocks) > 1:
            return None  # several values: the structural stage decides how they combine
        if unclosed is not None and unclosed[:1] in ("{", "["):
            return unclosed  # a fence opened and never closed (truncated output)
    start = min((p for p in (s.find("{"), s.find("[")) if p >= 0), default=-1)
    if start < 0:
        return None
    end = max(s.rfind("}"), s.rfind("]"))
    if end < start:
        return s[start:] if start > 0 else None
    if start == 0 and end == len(s) - 1:
        return None
    if balanced_end(s, start) != end + 1:
        # The value does not close where the last bracket is (truncated, or quotes that break the scan):
        # what follows it may be part of it ('{"k": "```json{}"', "re.compile(r'{}')"), so only cut the front.
        end = len(s) - 1
    if start == 0 and end == len(s) - 1:
        return None
    return s[start : end + 1]


_BRACKET_SCAN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]]', re.S)
# The same, with a quote that opens no complete string as a token of its own (it is skipped all the same).
_BRACKET_SCAN_QUOTES = re.compile(r'"(?:[^"\\]|\\.)*"|["{}\[\]]', re.S)


def balanced_end(text: str, start: int) -> int:
    """The index just past the bracket that closes the one at ``start`` (string-aware), or -1."""
    depth = 0
    for m in _BRACKET_SCAN.finditer(text, start):
        tok = m.group()
        if tok in "{[":
            depth += 1
        elif tok in "}]":
            depth -= 1
            if depth == 0:
                return m.end()
    return -1


class BracketMatcher:
    """``balanced_end`` for many openers of one text, in linear time overall.

    Scanning from an opener tokenizes the rest of the text once (strings skipped); that one pass settles
    the closing position of every opener it meets, since a scan started at any of them would see the same
    tokens. Only an opener inside a string of an earlier pass needs a pass of its own. The total work is
    capped at a few passes over the text: past the cap an opener not yet settled reads as unclosed, so a
    hostile text (``{"name": "x", [[[[...``) costs linear time where one scan per opener was quadratic.
    """

    __slots__ = ("_budget", "_ends", "_open_string", "_text", "scanned")

    def __init__(self, text: str, passes: int = 8) -> None:
        self._text = text
        self._ends: dict[int, int] = {}
        # Openers whose span holds a quote that no later quote closes (a string still open at the end).
        self._open_string: set[int] = set()
        self._budget = passes * len(text) + 4096
        self.scanned = 0  # characters tokenized so far

    def open_string(self, start: int) -> bool:
        """Does the value at ``start`` (after ``end(start)``) hold a string that nothing closes? In a text still
        arriving, that string is not finished: the brackets after its quote are its content, not structure."""
        return start in self._open_string

    def end(self, start: int) -> int:
        """The index just past the bracket closing the one at ``start``, or -1 (unclosed, or over budget)."""
        known = self._ends.get(start)
        if known is not None:
            return known
        if self._budget <= 0:
            return -1
        self._budget -= len(self._text) - start
        self.scanned += len(self._text) - start
        ends = self._ends
        stack: list[int] = []
        last_lone_quote = -1
        for m in _BRACKET_SCAN_QUOTES.finditer(self._text, start):
            tok = m.group()
            if tok in "{[":
                stack.append(m.start())
            elif tok == '"':
                last_lone_quote = m.start()
            elif tok in "}]" and stack:
                opener = stack.pop()
                if opener not in ends:
                    ends[opener] = m.end()
                    if last_lone_quote > opener:
                        self._open_string.add(opener)
        for opener in stack:
            ends.setdefault(opener, -1)
        return ends.get(start, -1)


def _double_encoded(text: str, key: str | None) -> StageResult:
    """JSON text that was encoded again as a string, with or without its outer quotes: ``{\\"a\\": 1}``."""
    s = text.strip()
    if len(s) < 2 or '\\"' not in s:
        return None
    if s[0] == '"' and s[-1] == '"':
        candidate = s
    elif s[0] in "{[":
        candidate = '"' + s + '"'
    else:
        return None
    try:
        inner = json.loads(candidate)
    except ValueError:
        return None
    return inner if isinstance(inner, str) and inner.strip()[:1] in ("{", "[") else None


def _doubled_braces(text: str, key: str | None) -> StageResult:
    """``{{"a": 1}}``: braces doubled by a template engine."""
    s = text.strip()
    if s.startswith("{{") and s.endswith("}}"):
        return s.replace("{{", "{").replace("}}", "}")
    return None


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BAD_IN_STRING = re.compile(r'[\x00-\x1f]|\\u(?![0-9a-fA-F]{4})|\\(?!["\\/bfnrtu])(.)?', re.S)
_QUOTE_LIKE = frozenset("'\u201e\u201c\u201d\u2018\u2019")
_CONTROL = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _fix_bad(m: re.Match[str]) -> str:
    t = m.group()
    if len(t) == 1 and t != "\\":
        return _CONTROL.get(t, f"\\u{ord(t):04x}")
    if t[1:] in _QUOTE_LIKE:
        return t[1:]  # \' or \„ escapes a quote JSON does not need escaped
    nxt = t[1:]
    if nxt and nxt < " ":
        return "\\\\" + _CONTROL.get(nxt, f"\\u{ord(nxt):04x}")
    return "\\\\" + nxt  # an unknown escape keeps its backslash (C:\Users, \d in a regex)


_CODE_KEY_BEFORE = re.compile(r'"(?:' + "|".join(sorted(CODE_FIELDS)) + r')"\s*:\s*\Z')


def _escapes(text: str, key: str | None) -> StageResult:
    """Raw newlines, tabs and control characters inside strings, and invalid escapes such as ``\\d``."""
    if not _BAD_IN_STRING.search(text):
        return None

    def fix(m: re.Match[str]) -> str:
        t = m.group()
        body = t[1:-1]
        trimmed = body.rstrip()
        # A raw line break just before the closing quote is layout, except in code, which keeps every byte.
        if (
            len(trimmed) != len(body)
            and "\n" in body[len(trimmed) :]
            and not _CODE_KEY_BEFORE.search(text, max(0, m.start() - 40), m.start())
        ):
            body = trimmed
        return '"' + _BAD_IN_STRING.sub(_fix_bad, body) + '"'

    return _JSON_STRING.sub(fix, text)


def _python(text: str, key: str | None) -> StageResult:
    """Python literal syntax: ``None``/``True``/``False``, single quotes, tuples and sets."""
    s = text.strip()
    if not s or s[0] not in "{[(":
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes warn in ast.parse; they are kept as written
            value = parse_python_literal(s)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    if not isinstance(value, dict | list):
        return None
    if s[0] != "(" and _top_is_bare_tuple(s):
        return None  # {"a": 1}, [] is two values, not a tuple: the structural stage combines them
    if _ADJACENT_QUOTES.search(s) and _has_implicit_concatenation(s):
        return None  # ["a" "b"] is two strings with a missing comma, not Python's "ab"
    return Found(value)


_ADJACENT_QUOTES = re.compile(r"[\"']\s*[\"']")


def _top_is_bare_tuple(s: str) -> bool:
    import ast

    try:
        return isinstance(ast.parse(s, mode="eval").body, ast.Tuple)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True


def _has_implicit_concatenation(s: str) -> bool:
    import io
    import tokenize

    previous = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(s).readline):
            if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                continue
            if tok.type == tokenize.STRING and previous == tokenize.STRING:
                return True
            previous = tok.type
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return True
    return False


def _json5(text: str, key: str | None) -> StageResult:
    """JSON5 via the json5 library: single quotes, unquoted keys, trailing commas, comments, hex, +1, .5."""
    try:
        return Found(json5.loads(text))
    except (ValueError, TypeError, RecursionError, IndexError, KeyError):
        return None


def _lenient(text: str, key: str | None) -> StageResult:
    """The structural parser: truncation, unescaped quotes by structure, missing commas, anything left."""
    ok, value = parse_lenient(text, key)
    return Found(value) if ok else None


STAGE_LIST: tuple[Stage, ...] = (
    Stage("strict", _strict, False, "json.loads, the fast path"),
    Stage("fences", _fences, True, "markdown fences and prose around the value"),
    Stage("double_encoded", _double_encoded, True, "JSON encoded again as a string"),
    Stage("doubled_braces", _doubled_braces, False, "{{ }} from a template"),
    Stage("escapes", _escapes, False, "raw control characters and invalid escapes inside strings"),
    Stage("python", _python, False, "Python literals: None/True/False, single quotes, tuples"),
    Stage("json5", _json5, False, "the JSON5 grammar (json5 library)"),
    Stage("lenient", _lenient, False, "structural repair of everything else"),
)


def _plugin_stage(name: str, loaded: Any) -> Stage:
    """A plug-in's stage: a ``Stage``, or a bare stage function (a fixing stage, summarised by its docstring)."""
    if isinstance(loaded, Stage):
        return loaded
    if callable(loaded):
        summary = ((getattr(loaded, "__doc__", None) or "").strip().splitlines() or [f"plug-in stage {name}"])[0]
        return Stage(name, loaded, False, summary)
    raise TypeError(f"expected a flowllm.parsing.repair.stages.Stage or a stage function, got {loaded!r}")


# repair.stages names stages from here; a plug-in adds its own under ``flowllm.repair_stages``.
STAGES: Registry[Stage] = Registry(
    "repair.stages", {s.name: s for s in STAGE_LIST}, group="flowllm.repair_stages", adapt=_plugin_stage
)

# The chains conf/repair/*.yaml name; the YAML files list the same stages so a sweep shows what each one ran.
PRESETS: dict[str, tuple[str, ...]] = {
    "none": ("strict",),
    "strict": ("strict", "fences", "escapes"),
    "json5_only": ("strict", "json5"),
    "full": ("strict", "fences", "double_encoded", "doubled_braces", "escapes", "python", "lenient"),
}
FULL_CHAIN: tuple[str, ...] = PRESETS["full"]
