"""The structural repair parser: the last stage of the ``full`` chain.

It reads what a model meant by JSON when the text is not JSON: truncated output (unterminated strings, unclosed
brackets), raw newlines and unescaped quotes inside strings, invalid escapes, Python literals, single or smart
quotes, unquoted keys and values, missing or trailing commas, comments, stray or mismatched closing brackets,
and several values in a row.

The one idea that matters most is how a string ends. A quote ends a string only where what follows continues
the document validly (``_ends_here``): a comma and then the next key (in an object) or value (in an array), the
closing bracket of an open container followed by whatever may validly follow *it*, or the end of the text.
Anything else is a quote inside the string. That is why code with quotes, dict literals, HTML attributes and JSON
inside a string survive intact. Only when no quote qualifies do heuristics step in, and the heuristics that
guess (cutting a string at ``, "key":``, reading stray quotes as junk) never apply to code fields
(``CODE_FIELDS``), whose content is kept exactly as written.

Scanning is done with ``str.find`` and compiled regexes rather than character by character, which is what makes
this stage several times faster than the json_repair library on the same inputs.
"""

from __future__ import annotations

import re
from typing import Any

from flowllm.parsing.repair.strings import decode_string, string_value

# Fields whose string values are program text: never cut at a guessed boundary, never trimmed.
CODE_FIELDS = frozenset(
    {"code", "code_block", "command", "cmd", "script", "shell", "bash", "python", "source", "source_code"}
)

_MAX_DEPTH = 500  # deeper nesting is refused (a clean failure) rather than risking the interpreter's stack

_CLOSE_QUOTE = {'"': '"', "'": "'", "\u201c": "\u201d", "\u201d": "\u201d", "\u2018": "\u2019", "\u2019": "\u2019"}
_QUOTES = frozenset(_CLOSE_QUOTE)
_CLOSERS = frozenset("}])")
_WS_START = frozenset(" \t\n\r\f\v\u00a0\ufeff#/")

# A '#' comment stops before a closing bracket on its line: models write {"a": 1 # note } on one line.
_SKIP = re.compile(r"(?:\s+|//[^\n]*|/\*(?:.*?\*/|.*\Z)|#[^\n}\]]*)*", re.S)
_OPENER = re.compile(r"[\[{(]")
# The next key: quoted, doubled-quoted or bare, possibly after one stray word (`, COMMENT "k":`).
_KEY_AHEAD = re.compile(
    r"(?:[A-Za-z_]\w*\s+(?=[\"']))?(?:\"\"(?:[^\"\\\n]|\\.)*\"\"|''(?:[^'\\\n]|\\.)*''|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|[A-Za-z_$][\w$.-]*)\s*:"
)
_KEY_NO_COLON = re.compile(r"\s*\"(?:[^\"\\\n]|\\.)*\"\s*(?:[,}]|\Z)")
_ARRAY_STR_AHEAD = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"\s*(?:[,\]\"'{\[\d:-]|\Z)")
_WEAK_ARRAY_END = re.compile(r"\s+\w")
_REOPEN = re.compile(r",\s*(?:\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*')\s*[:\"']")
_LITERAL = re.compile(r"(?i:true|false|null|none)(?![\w$-])")
_LITERALS = {"true": True, "false": False, "null": None, "none": None}
_NUMBER = re.compile(r"[-+]?(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][-+]?\d+)?")
_DANGLING_EXP = re.compile(r"[eE][-+]?(?![\w.])")
_UNQUOTED_KEY = re.compile(r"[^\s:,{}\[\]\"'()]+")
_UNQUOTED_RUN = re.compile(r"[^,\n\"{}\[\]()]*")
_COMMA_KEY = re.compile(r",\s*(?:\"[^\"\n]*\"|'[^'\n]*'|([A-Za-z_][\w]*))\s*:\s*")
_BRACE_KEY = re.compile(r"\}\s+[A-Za-z_]\w*\s*:")
_SET_BODY = re.compile(
    r"\{\s*((?:\"[^\"]*\"|'[^']*'|[-+]?\d+(?:\.\d+)?)(?:\s*,\s*(?:\"[^\"]*\"|'[^']*'|[-+]?\d+(?:\.\d+)?))*)\s*,?\s*\}"
)
_MISSING = object()


class _TooDeep(ValueError):
    pass


def _same_shape(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and _same_shape(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_shape(x, y) for x, y in zip(a, b, strict=True))
    return True


class LenientParser:
    """One parse of one text. Use ``parse_lenient``; the class only holds the cursor and the bracket stack."""

    __slots__ = ("i", "n", "s", "stack")

    def __init__(self, text: str) -> None:
        self.s = text
        self.n = len(text)
        self.i = 0
        # Closing characters of the open containers, outermost first: decides which closer ends what.
        self.stack: list[str] = []

    # ----------------------------------------------------------------------------------------- scanning
    def _skip(self, k: int) -> int:
        if k < self.n and self.s[k] not in _WS_START:
            return k
        return _SKIP.match(self.s, k).end()  # type: ignore[union-attr]

    def _skip_back(self, k: int) -> int:
        while k > 0 and self.s[k - 1].isspace():
            k -= 1
        return k - 1 if k > 0 else 0

    def _fence_ends_text(self, k: int) -> bool:
        return self.s.startswith("```", k) and self._skip(k + 3) >= self.n

    def _value_ahead(self, k: int) -> bool:
        c = self.s[k]
        return c in _QUOTES or c in "{[(-.0123456789" or _LITERAL.match(self.s, k) is not None

    def _after_value(self, k: int, lvl: int) -> bool:
        """Does the text at ``k`` validly follow a complete value held by container ``stack[lvl]``?"""
        s, n, stack = self.s, self.n, self.stack
        while True:
            k = self._skip(k)
            if k >= n or self._fence_ends_text(k):
                return True
            if lvl < 0:
                return False
            c, closer = s[k], stack[lvl]
            if c == ",":
                k = self._skip(k + 1)
                if k >= n:
                    return True
                if s[k] == closer:  # a trailing comma before the close
                    k, lvl = k + 1, lvl - 1
                    continue
                if closer == "}":
                    # {"k": ["a"], ["b"]}: json_repair's reading is that the array goes on
                    return s[k] == "[" or _KEY_AHEAD.match(s, k) is not None
                return self._value_ahead(k)
            if c in _CLOSERS:
                j = lvl
                while j >= 0 and stack[j] != c:
                    j -= 1
                if j < 0:  # a stray closer: the parser skips it, so does the look-ahead
                    k += 1
                    continue
                if j == 0:  # the document's outer container closes here
                    k = self._skip(k + 1)
                    if k >= n or self._fence_ends_text(k) or s[k] in "{[":
                        return True  # the end, or the next of several top-level values
                    if s[k] == "," and s[self._skip(k + 1) : self._skip(k + 1) + 1] in ("{", "["):
                        return True
                    return c == "}" and _REOPEN.match(s, k) is not None
                k, lvl = k + 1, j - 1
                continue
            if closer == "}":
                # a missing comma before the next key
                return c in _QUOTES and _KEY_AHEAD.match(s, k) is not None
            if c == ":":
                return True  # ["key": "value"]: an object whose braces are missing
            if c in _QUOTES:
                return _ARRAY_STR_AHEAD.match(s, k) is not None
            return c in "{[0123456789"  # a missing comma before the next element

    def _ends_here(self, k: int, key: bool) -> bool:
        """Would a quote just before ``k`` validly close the string being read?"""
        if key:
            j = self._skip(k)
            return (j < self.n and self.s[j] == ":") or _KEY_NO_COLON.match(self.s, k) is not None
        return self._after_value(k, len(self.stack) - 1)

    def _trailing_cut(self, start: int) -> int:
        """Where an unterminated string stops: before the fence and closers that end the whole text."""
        s, stack = self.s, self.stack
        end, lvl = self.n, 0
        while end > start:
            stripped = len(s[start:end].rstrip()) + start
            if s.endswith("```", start, stripped):
                end = stripped - 3
            elif lvl < len(stack) and s[stripped - 1 : stripped] == stack[lvl]:
                end, lvl = stripped - 1, lvl + 1
            else:
                break
        return end

    # ----------------------------------------------------------------------------------------- values
    def parse_value(self, field: str | None) -> Any:
        s = self.s
        i = self.i = self._skip(self.i)
        if i >= self.n:
            return _MISSING
        c = s[i]
        if c == "{":
            return self._object()
        if c == "[":
            return self._array("]")
        if c == "(":
            return self._paren()
        if c in _QUOTES:
            return self._string(False, field)
        if c in "-+.0123456789":
            return self._number(field)
        if c in _CLOSERS or c in ",:":
            return _MISSING
        m = _LITERAL.match(s, i)
        if m is not None:
            self.i = m.end()
            return _LITERALS[m.group().lower()]
        return self._unquoted()

    def _push(self, closer: str) -> None:
        if len(self.stack) >= _MAX_DEPTH:
            raise _TooDeep("nesting too deep to repair")
        self.stack.append(closer)

    def _object(self) -> Any:
        s = self.s
        m = _SET_BODY.match(s, self.i)
        if m is not None and ("," in m.group(1) or m.group(1)[0] not in "\"'"):
            # {'a', 'b'} is a Python set, {5} a one-element one: both read as a list.
            return self._array("}")
        self.i += 1
        self._push("}")
        obj: dict[str, Any] = {}
        self._members(obj)
        self.stack.pop()
        return obj

    def _members(self, obj: dict[str, Any]) -> None:
        """Read ``key: value`` pairs into ``obj`` until its ``}`` (consumed) or an enclosing closer (left)."""
        s, n = self.s, self.n
        last_list: list[Any] | None = None
        while True:
            i = self.i = self._skip(self.i)
            if i >= n:
                return
            c = s[i]
            if c == "}":
                self.i = i + 1
                if len(self.stack) == 1:
                    # {"a": 1}, "b": 2}: a stray early brace; the members go on.
                    k = self._skip(i + 1)
                    if _REOPEN.match(s, k):
                        self.i = k + 1
                        continue
                return
            if c in _CLOSERS:
                if c in self.stack:
                    return  # closes an enclosing container: leave it for that one
                self.i = i + 1
                continue
            if c in ",:":
                self.i = i + 1
                continue
            if c in _QUOTES:
                k = self._skip(i + 1)
                if k < n and s[k] in ",}" and c not in s[i + 1 : k] and not _KEY_AHEAD.match(s, i):
                    self.i = i + 1  # a stray quote left after a value
                    continue
            value: Any
            if c == "[":
                # { "k": ["a"], ["b"] }: the array continues the previous list value
                value = self._array("]")
                if last_list is not None and isinstance(value, list):
                    last_list.extend(value)
                elif isinstance(value, list) and value:
                    obj[str(value[0])] = ""
                continue
            if c == "{":
                self.parse_value(None)  # an object where a key should be: nothing to attach it to
                continue
            key = self._key()
            if key is None:
                continue
            i = self.i = self._skip(self.i)
            if i < n and s[i] == ":":
                self.i = i + 1
            elif i >= n or s[i] in "}":
                return  # a key with neither colon nor value at the end: not a member
            j = self.i = self._skip(self.i)
            if j >= n or s[j] in ",}]":
                value = ""  # "key": , -> an empty value
            else:
                value = self.parse_value(key)
                if value is _MISSING:
                    value = ""
            obj[key] = value
            last_list = value if isinstance(value, list) else None

    def _key(self) -> str | None:
        s = self.s
        c = s[self.i]
        if c in _QUOTES:
            return self._string(True, None)
        if c in "-+.0123456789" or c.isalpha() or c in "_$":
            m = _UNQUOTED_KEY.match(s, self.i)
            assert m is not None
            k = self._skip(m.end())
            self.i = m.end()
            if k < self.n and s[k] == ":":
                return m.group()
            return None  # a word that is not followed by a colon is junk between members
        self.i += 1
        return None

    def _array(self, closer: str) -> list[Any]:
        s, n = self.s, self.n
        self.i += 1
        self._push(closer)
        out: list[Any] = []
        while True:
            i = self.i = self._skip(self.i)
            if i >= n:
                break
            c = s[i]
            if c == closer:
                self.i = i + 1
                break
            if c in _CLOSERS:
                if c in self.stack:
                    break
                self.i = i + 1
                continue
            if c in ",:":
                self.i = i + 1
                continue
            if s.startswith("...", i):  # [1, 2, ...] elides, it does not add a value
                self.i = i + 3
                continue
            before = i
            value = self.parse_value(None)
            if value is _MISSING:
                self.i = max(self.i, before + 1)
                continue
            k = self._skip(self.i)
            if isinstance(value, str) and k < n and s[k] == ":":
                # ["key": "value"]: an object whose braces are missing
                self.i = k + 1
                obj: dict[str, Any] = {}
                inner = self.parse_value(value)
                obj[value] = "" if inner is _MISSING else inner
                self._push("}")
                self._members(obj)
                self.stack.pop()
                value = obj
            elif (value == {} or value == []) and s[self.i - 1] not in "}])":
                continue  # [{] : a container closed by someone else's bracket, with nothing in it
            elif self.i >= n and value == "" and s[before] != closer:
                continue  # a string cut off before it had any content adds nothing
            elif (
                self.i >= n
                and isinstance(value, str)
                and s[before] not in _QUOTES
                and out
                and isinstance(out[-1], dict | list)
                and "," not in s[self._skip_back(before) : before]
            ):
                continue  # [{5}s : a stray word after the last element, at the cut-off end
            out.append(value)
        self.stack.pop()
        return out

    def _paren(self) -> Any:
        s = self.s
        start = self.i
        values = self._array(")")
        # (1, 2) is a tuple; (1) is a grouped value; () is an empty tuple.
        body = s[start + 1 : self.i]
        if len(values) == 1 and "," not in body:
            return values[0]
        return values

    def _number(self, field: str | None) -> Any:
        s, i = self.s, self.i
        m = _NUMBER.match(s, i)
        if m is None:
            if s[i] in "-+." and (i + 1 >= self.n or not s[i + 1].isalnum()):
                self.i = i + 1
                return _MISSING  # a lone sign or dot
            return self._unquoted()
        end = m.end()
        d = _DANGLING_EXP.match(s, end)
        if d is not None:
            end = d.end()  # 1e with no digits: the exponent was cut off
        if end < self.n:
            c = s[end]
            if not (c.isspace() or c in ",}]):\"'" or s.startswith("//", end) or s.startswith("/*", end)):
                return self._unquoted()  # 1/3, 10-20, 1.1.1, 57eeeeb1-...: text, not a number
        self.i = end
        text = m.group().replace("_", "")
        try:
            if any(ch in text for ch in ".eE"):
                value = float(text)
                if value in (float("inf"), float("-inf")):
                    return m.group()
                return value
            return int(text)
        except ValueError:
            return m.group()

    def _unquoted(self) -> Any:
        """A value written without quotes: runs to a delimiter, keeping balanced brackets inside it."""
        s, n, i = self.s, self.n, self.i
        in_object = bool(self.stack) and self.stack[-1] == "}"
        if in_object:
            # A missing opening quote: the value runs to the quote that closes it ("k": ipsum, sic.",)
            q = s.find('"', i)
            if q > i:
                k = self._skip(q + 1)
                if k >= n or s[k] in ",}":
                    self.i = q + 1
                    return s[i:q].strip()
        j = i
        depth = 0
        while True:
            j = _UNQUOTED_RUN.match(s, j).end()  # type: ignore[union-attr]
            if j >= n:
                break
            c = s[j]
            if c in "{[(":
                depth += 1
            elif c in "}])":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0:
                break
            j += 1
        value = s[i:j].strip()
        self.i = j
        if j < n and s[j] == '"':
            k = self._skip(j + 1)
            if k >= n or s[k] in ",}]":
                self.i = j + 1  # the quote closes a value whose opening quote is missing
        if not value:
            self.i = max(self.i, i + 1)
            return _MISSING
        return value

    # ----------------------------------------------------------------------------------------- strings
    def _string(self, key: bool, field: str | None) -> str | Any:
        s, n = self.s, self.n
        close = _CLOSE_QUOTE[s[self.i]]
        start = self.i + 1
        code = not key and field is not None and field.lower() in CODE_FIELDS
        if start < n and s[start] == close:
            if self._ends_here(start + 1, key):
                self.i = start + 1
                return ""
            j = s.find(close + close, start + 1)
            if j > start + 1 and close not in s[start + 1 : j] and self._ends_here(j + 2, key):
                self.i = j + 2  # ""doubled"" delimiters
                return string_value(s[start + 1 : j], key, code, terminated=True)
            start += 1  # a doubled opening quote: one of them is a typo
        in_array = not key and bool(self.stack) and self.stack[-1] != "}"
        pos, inner, last_q, end = start, 0, -1, -1
        while True:
            j = s.find(close, pos)
            if j < 0:
                break
            b = j
            while b > start and s[b - 1] == "\\":
                b -= 1
            if (j - b) % 2:  # escaped
                pos = j + 1
                continue
            if self._ends_here(j + 1, key):
                end = j
                break
            if in_array and not code and inner % 2 == 0 and _WEAK_ARRAY_END.match(s, j + 1):
                end = j  # ["a" b", "c"]: a closing quote followed by a word, with no inner quote open
                break
            inner, last_q, pos = inner + 1, j, j + 1
        if end < 0 and key:
            colon = s.find(":", start)
            if colon > 0 and "\n" not in s[start:colon]:
                self.i = colon  # {"key:"value"} / {"key:value}: the key ends at its colon
                return decode_string(s[start:colon].rstrip(close))
        terminated = True
        if (
            end >= 0
            and inner % 2
            and not code
            and not key
            and self._trailing_cut(end + 1) <= end + 1
            and "\u201e" not in s[start:end]
            and "\u201c" not in s[start:end]
        ):
            # {"key": "v"alue"} at the very end: the last quote closes the inner one, not the string
            # (unless a low or opening typographic quote explains the odd inner one: „word")
            end = -1
            inner = 0
        if end >= 0:
            self.i = end + 1
        elif not code and inner % 2 == 1:
            end = last_q  # one stray quote: it closes the value and what follows is junk
            self.i = end + 1
        else:
            end = self.i = self._trailing_cut(start)
            terminated = False
        if not key and not code and (not terminated or inner):
            cut = self._comma_key_cut(start, end, terminated)
            if cut >= 0:
                end = self.i = cut
        return string_value(s[start:end], key, code, terminated)

    def _comma_key_cut(self, start: int, end: int, terminated: bool) -> int:
        """Where ``, "key":`` inside a value shows its closing quote was forgotten, or -1."""
        s = self.s
        if not terminated:
            b = _BRACE_KEY.search(s, start, end)
            if b is not None and s.count("{", start, b.start()) == s.count("}", start, b.start()):
                return b.start()  # {"key": "value} key2: v}: the brace closed the object; the rest is junk
        # Bracket balance from ``start`` to each candidate, counted on from the previous one (counting from
        # ``start`` each time is quadratic in a string holding many ', "k":').
        braces = brackets = 0
        counted = start
        for m in _COMMA_KEY.finditer(s, start, end):
            p = m.start()
            braces += s.count("{", counted, p) - s.count("}", counted, p)
            brackets += s.count("[", counted, p) - s.count("]", counted, p)
            counted = p
            if braces or brackets:
                continue  # inside JSON quoted in the string: {"a": 1, "b": 2}
            if m.group(1) is not None and terminated and s[m.end() : m.end() + 1] not in ('"', "'", "[", "{"):
                continue  # "Note, however: ..." is prose, unless what follows the colon is clearly a value
            return p
        return -1

    # ----------------------------------------------------------------------------------------- document
    def parse_document(self, field: str | None = None) -> tuple[bool, Any]:
        """Every top-level value in the text, combined the way json_repair combines them."""
        s, n = self.s, self.n
        values: list[Any] = []
        while True:
            m = _OPENER.search(s, self.i)
            if m is None:
                break
            start = m.start()
            self.i = start
            if s[start] == "(":
                if not _starts_document(s, start, bool(values)):
                    # print("hi"), garbage ((: a call or prose, not a tuple; only a value may open with '('
                    self.i = start + 1
                    continue
                value = self._paren()
                if self._skip(self.i) < n and not self._fence_ends_text(self._skip(self.i)):
                    self.i = start + 1  # (a remark in prose) is not a value
                    continue
            else:
                value = self.parse_value(field)
            k = start - 1
            while k >= 0 and s[k].isspace():
                k -= 1
            comma = (k >= 0 and s[k] == ",") or s[self._skip(self.i) : self._skip(self.i) + 1] == ","
            if not values:
                values.append(value)
            elif value or value == 0:
                if not comma and _same_shape(values[-1], value):
                    values.pop()  # a repeated object is an update: keep the newest
                elif not values[-1]:
                    values.pop()
                values.append(value)
            if self.i <= start:
                self.i = start + 1
        if not values:
            if field is not None:
                return self._scalar_document(field)
            return False, None
        return True, values[0] if len(values) == 1 else values

    def _scalar_document(self, field: str) -> tuple[bool, Any]:
        """A field's value that is a bare string, number or literal (``repair_json(text, key=...)``)."""
        self.i = self._skip(0)
        if self.i >= self.n:
            return False, None
        value = self.parse_value(field)
        if value is _MISSING:
            return False, None
        return True, value


def _starts_document(s: str, at: int, after_value: bool) -> bool:
    """Is the ``(`` at ``at`` where a value may start: the text's first character, or (after a value) the
    next thing after a separator?"""
    k = at - 1
    while k >= 0 and (s[k].isspace() or (after_value and s[k] == ",")):
        k -= 1
    return k < 0 or (after_value and s[k] in "}])")


def parse_lenient(text: str, field: str | None = None) -> tuple[bool, Any]:
    """Read ``text`` as the JSON its author meant. ``(False, None)`` when it holds no JSON value at all."""
    try:
        return LenientParser(text).parse_document(field)
    except _TooDeep:
        return False, None
