"""Formats with no marker of their own: pythonic lists and plain JSON. They run only when no marked format
found anything, because a reply that quotes JSON or Python is far more common than one that calls a tool
this way.

* ``pythonic``: ``[get_weather(city='Paris'), search(q="x")]`` (Llama 3.2/4, also between
  ``<|python_start|>`` and ``<|python_end|>``). Each call is read with ``ast`` on its own, so one broken call
  does not take its siblings down; a list that is not made only of calls (a list comprehension, a list of
  positional calls) is prose and ignored.
* ``json``: ``{"name"|"tool": ..., "arguments"|"parameters": {...}}`` objects anywhere in the text (bare, in a
  ```json fence, after ``<|python_tag|>``, separated by ``;`` or newlines), and JSON lists of them. An object
  is a call only with both a name and an arguments key: text that merely contains JSON is not a call, and
  neither is a tool definition the model repeated (``{"name", "description", "parameters": {schema}}``).

Neither reads inside a code fence of a programming language (```python, ```js ...): code that builds such an
object or list is content. A ```json fence (or one with no language) is how many models wrap a call.
"""

from __future__ import annotations

import ast
import bisect
import contextlib
import gc
import re
import warnings
from collections.abc import Iterator

from flowllm.parsing.pyliteral import NotJSON, to_json_value
from flowllm.parsing.repair.stages import BracketMatcher, loads_strict
from flowllm.parsing.safety import failure_reason
from flowllm.parsing.toolcalls import families
from flowllm.parsing.toolcalls.base import Context, Hit, RawCall, call_from_object, dumps

_PY_LIST = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_PY_TOKEN = re.compile(r"'''.*?'''|\"\"\".*?\"\"\"|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|[\[\](){},]", re.S)
_PY_MARKERS = re.compile(r"<\|python_start\|>|<\|python_end\|>")
_PAIRS = {"]": "[", ")": "(", "}": "{"}
_CALL_HEAD = re.compile(r"\s*[A-Za-z_][\w.]*\s*\(")


def _split_list(text: str, start: int) -> tuple[int, list[tuple[int, int]], str | None]:
    """The end of the Python list at ``start`` and its top-level element spans, or an error."""
    stack: list[str] = []
    elements: list[tuple[int, int]] = []
    elem_start = start + 1
    for m in _PY_TOKEN.finditer(text, start):
        tok = m.group()
        if tok in "[({":
            stack.append(tok)
        elif tok in "])}":
            if not stack or stack[-1] != _PAIRS[tok]:
                return m.end(), elements, f"mismatched {tok!r}"
            stack.pop()
            if not stack:
                elements.append((elem_start, m.start()))
                return m.end(), elements, None
        elif tok == "," and len(stack) == 1:
            elements.append((elem_start, m.start()))
            elem_start = m.end()
    return len(text), elements, "unclosed list"


@contextlib.contextmanager
def _no_gc_passes() -> Iterator[None]:
    """The cyclic collector paused while a tree is built: a reply of 200,000 keywords is 200,000 new nodes, and
    collection passes over them made parsing grow faster than the text (16x per 10x at 1 MB, 9x without)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse_expr(source: str) -> ast.expr:
    with _no_gc_passes():
        if "\\" not in source:
            return ast.parse(source, mode="eval").body
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # '\d' in a string warns; it is kept as written
            return ast.parse(source, mode="eval").body


def _read_call(source: str | ast.expr) -> RawCall:
    node = _parse_expr(source.strip()) if isinstance(source, str) else source
    if not isinstance(node, ast.Call):
        raise NotJSON("not a call")
    if node.args:
        raise NotJSON("positional arguments have no parameter names")
    func = node.func
    name = ast.unparse(func) if isinstance(func, ast.Name | ast.Attribute) else None
    if not name:
        raise NotJSON("the called thing is not a name")
    args = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise NotJSON("**kwargs")
        args[kw.arg] = to_json_value(kw.value)
    return RawCall(name, dumps(args))


_FENCE = re.compile(r"^[ \t]*```[ \t]*([^\s`]*)[^\n]*\n", re.M)
_FENCE_CLOSE = re.compile(r"^[ \t]*```", re.M)
# Fence languages that hold data, not code: a call may sit in them.
_DATA_FENCES = frozenset({"", "json", "jsonc", "json5", "tool_call", "tool_code", "javascript-object"})


def code_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each code fence in a programming language; an unclosed one runs to the end."""
    if "```" not in text:
        return []
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if m is None:
            break
        close = _FENCE_CLOSE.search(text, m.end())
        end = close.end() if close else len(text)
        if m.group(1).lower() not in _DATA_FENCES:
            spans.append((m.start(), end))
        pos = max(end, m.end())
    return spans


def _in_code(spans: list[tuple[int, int]], at: int) -> int:
    """The end of the code span holding ``at``, or -1."""
    i = bisect.bisect_right(spans, (at, 1 << 62)) - 1  # the last span starting at or before ``at``
    if i >= 0 and spans[i][0] <= at < spans[i][1]:
        return spans[i][1]
    return -1


def scan_pythonic(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    pos = 0
    code = code_spans(text)
    while True:
        m = _PY_LIST.search(text, pos)
        if m is None:
            break
        start = m.start()
        skip = _in_code(code, start) if code else -1
        if skip >= 0:
            pos = skip
            continue
        end, elements, error = _split_list(text, start)
        if error == "unclosed list" and not final:
            hits.append(Hit(start, len(text), complete=False))
            break
        pos = max(end, start + 1)
        sources = [text[a:b] for a, b in elements if text[a:b].strip()]
        whole: ast.expr | None = None
        if error is None:
            try:
                whole = _parse_expr(text[start:end])
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                whole = None  # read element by element below, so each failure is reported on its own
            if whole is not None and not (
                isinstance(whole, ast.List) and all(isinstance(e, ast.Call) and not e.args for e in whole.elts)
            ):
                continue  # a list comprehension or a list of ordinary calls: Python in prose, not tool calls
        if not sources or not all(_CALL_HEAD.match(s) for s in sources):
            continue
        if error is not None:
            hits.append(Hit(start, end, bad_reason=f"pythonic tool-call list: {error}", keep_text=True))
            continue
        found: list[Hit] = []
        # The whole list parsed: read its calls from that tree; else each element alone, to save the good ones.
        items: list[str | ast.expr] = list(whole.elts) if isinstance(whole, ast.List) else list(sources)
        for src, item in zip(sources, items, strict=False):
            try:
                found.append(Hit(start, end, _read_call(item)))
            except (SyntaxError, NotJSON) as e:
                found.append(Hit(start, end, bad_reason=f"{src.strip()[:60]}: {e}", keep_text=True))
            except (ValueError, RecursionError, MemoryError) as e:
                reason = f"{src.strip()[:60]}: {failure_reason(e)}"
                found.append(Hit(start, end, bad_reason=reason, keep_text=True))
        if all(h.call is None for h in found):
            for h in found:
                h.keep_text = True
        hits.extend(found)
    hits.extend(Hit(x.start(), x.end()) for x in _PY_MARKERS.finditer(text))
    return hits


_PYTHON_TAG = re.compile(r"<\|python_tag\|>")
_OBJ_START = re.compile(r"[\[{]")
_NAME_HINT = re.compile(r'"(?:name|tool|tool_name|function)"\s*:')


def scan_json(text: str, ctx: Context, final: bool) -> list[Hit]:
    if families.FUNCTIONARY not in text:  # with ">>>" in the text, the functionary scanner read the lead call
        lead = families.functionary_lead(text, ctx, final)
        if lead is not None:
            return [lead]
    if "{" not in text or not _NAME_HINT.search(text):
        return [Hit(x.start(), x.end()) for x in _PYTHON_TAG.finditer(text)]
    hits: list[Hit] = []
    pos = 0
    code = code_spans(text)
    brackets = BracketMatcher(text)
    hints = [h.start() for h in _NAME_HINT.finditer(text)]
    # Blocks that are JSON but not calls are looked into (a call may sit inside one); reading each nested
    # block again is quadratic in the depth, so the text given to the JSON reader is capped at a few passes.
    read_budget = 8 * len(text) + 4096
    while True:
        m = _OBJ_START.search(text, pos)
        if m is None:
            break
        start = m.start()
        skip = _in_code(code, start) if code else -1
        if skip >= 0:
            pos = skip
            continue
        end = brackets.end(start)
        if end < 0:
            # An unclosed list may still hold complete calls: look inside it. An unclosed object waits.
            if not final and text[start] == "{" and _NAME_HINT.search(text, start):
                hits.append(Hit(start, len(text), complete=False))
                break
            pos = start + 1  # unbalanced (a fragment, or broken JSON in prose): look inside it instead
            continue
        calls: list[RawCall] = []
        i = bisect.bisect_right(hints, start)
        if i < len(hints) and hints[i] < end and read_budget > 0:  # no name key inside: not a call
            read_budget -= end - start
            calls = _calls_in(text[start:end])
        if calls:
            hits.extend(Hit(start, end, c) for c in calls)
            pos = end
        else:
            pos = start + 1
    hits.extend(Hit(x.start(), x.end()) for x in _PYTHON_TAG.finditer(text))
    return hits


def _calls_in(block: str) -> list[RawCall]:
    try:
        value = loads_strict(block)
    except ValueError:
        return []
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(v, require_arguments=True) for v in items]
    if not items or any(c is None for c in calls):
        return []
    return [c for c in calls if c is not None]
