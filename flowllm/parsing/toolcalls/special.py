"""Formats marked by special tokens: Mistral, Kimi-K2 and DeepSeek-V3.

* ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (before tokenizer v11), or
  ``[TOOL_CALLS]name{...}`` once per call (v11+, also with an ``[ARGS]`` token between name and arguments).
* ``kimi_k2``: ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>``
  inside ``<|tool_calls_section_begin|> ... <|tool_calls_section_end|>``.
* ``deepseek_v3``: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` then the arguments in a ```json fence,
  then ``<｜tool▁call▁end｜>`` (V3.1 writes ``NAME<｜tool▁sep｜>{...}`` instead). The bars are full-width.
"""

from __future__ import annotations

import re

from flowllm.parsing.repair.stages import BracketMatcher, fenced_blocks, loads_strict
from flowllm.parsing.toolcalls.base import Context, Hit, RawCall, parse_call_object

MISTRAL = "[TOOL_CALLS]"
_MISTRAL_NAME = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*(?:\[ARGS\])?\s*")


def scan_mistral(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    brackets = BracketMatcher(text)
    starts = [m.start() for m in re.finditer(re.escape(MISTRAL), text)]
    for idx, at in enumerate(starts):
        body_start = at + len(MISTRAL)
        limit = starts[idx + 1] if idx + 1 < len(starts) else len(text)
        j = body_start
        while j < limit and text[j].isspace():
            j += 1
        name_m = _MISTRAL_NAME.match(text, body_start, limit)
        v11 = name_m is not None and (name_m.end() >= limit or text[name_m.end()] == "{")
        if not v11 and text.find("[", j, limit) >= 0:
            # pre-v11: a JSON list, perhaps after some junk
            list_at = text.find("[", j, limit)
            if list_at < 0:
                hits.append(Hit(at, body_start, bad_reason="[TOOL_CALLS] is not followed by calls"))
                continue
            end = brackets.end(list_at)
            if end < 0 or end > limit:
                if not final:
                    hits.append(Hit(at, limit, complete=False))
                    continue
                end = limit
            elif not final and brackets.open_string(list_at) and not _is_json(text[list_at:end]):
                hits.append(Hit(at, limit, complete=False))  # as below: maybe a bracket in an open string
                continue
            calls, error = parse_call_object(text[list_at:end], require_arguments=False)
            if error:
                hits.append(Hit(at, end, bad_reason=f"[TOOL_CALLS] list: {error}", keep_text=True))
            else:
                hits.extend(Hit(at, end, c) for c in calls)
            continue
        if name_m is None:
            hits.append(Hit(at, body_start, bad_reason="[TOOL_CALLS] is not followed by calls"))
            continue
        name = name_m.group(1)
        brace = name_m.end()
        if brace >= limit or text[brace] != "{":
            if not final and brace >= len(text):
                hits.append(Hit(at, limit, complete=False))
                continue
            hits.append(Hit(at, name_m.end(), bad_reason=f"[TOOL_CALLS]{name} has no arguments", keep_text=True))
            continue
        end = brackets.end(brace)
        if end < 0 or end > limit:
            if not final:
                hits.append(Hit(at, limit, complete=False))
                continue
            end = limit  # cut off: repair_arguments closes it
        elif not final and brackets.open_string(brace) and not _is_json(text[brace:end]):
            # Still streaming: a bracket inside a string not yet closed looks like the end ({"a": "}...).
            hits.append(Hit(at, limit, complete=False))
            continue
        hits.append(Hit(at, end, RawCall(name, text[brace:end].strip())))
    return hits


def _is_json(text: str) -> bool:
    try:
        loads_strict(text)
    except ValueError:
        return False
    return True


KIMI_MARKERS = ("<|tool_call_begin|>", "<|tool_calls_section_begin|>")
_KIMI_BEGIN = "<|tool_call_begin|>"
_KIMI_ARG = "<|tool_call_argument_begin|>"
_KIMI_END = re.compile(r"<\|tool_call_end\|>|<\|tool_call_begin\|>|<\|tool_calls_section_end\|>")
_KIMI_SECTION = re.compile(r"<\|tool_calls_section_(?:begin|end)\|>")


def _kimi_calls(text: str) -> list[tuple[int, int, str]]:
    """(start, arguments start, reference) of each ``<|tool_call_begin|>REF<|tool_call_argument_begin|>``.

    Found with ``str.find`` rather than a lazy regex, which would scan to the end of the text once per begin
    marker that has no argument marker after it."""
    out = []
    pos = text.find(_KIMI_BEGIN)
    arg = -1
    while pos >= 0:
        if arg < pos + len(_KIMI_BEGIN):  # found once, reused by every begin before it
            arg = text.find(_KIMI_ARG, pos + len(_KIMI_BEGIN))
        if arg < 0:
            break
        nxt = text.find(_KIMI_BEGIN, pos + len(_KIMI_BEGIN))
        if 0 <= nxt < arg:  # this begin has no argument marker of its own: the next begin owns that one
            pos = nxt
            continue
        out.append((pos, arg + len(_KIMI_ARG), text[pos + len(_KIMI_BEGIN) : arg].strip()))
        pos = text.find(_KIMI_BEGIN, arg)
    return out


def scan_kimi(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    for start, args_start, ref in _kimi_calls(text):
        # ref: functions.get_weather:0
        name = ref.split(":", 1)[0].removeprefix("functions.").strip()
        end_m = _KIMI_END.search(text, args_start)
        if (end_m is None or not end_m.group().startswith("<|tool_call_end")) and not final:
            hits.append(Hit(start, len(text), complete=False))
            break
        args_end = end_m.start() if end_m else len(text)
        end = end_m.end() if end_m and end_m.group() == "<|tool_call_end|>" else args_end
        if not name:
            hits.append(Hit(start, end, bad_reason="Kimi-K2 call without a function name", keep_text=True))
            continue
        hits.append(Hit(start, end, RawCall(name, text[args_start:args_end].strip())))
    # The section markers are format syntax, not content.
    hits.extend(Hit(s.start(), s.end()) for s in _KIMI_SECTION.finditer(text))
    return hits


DEEPSEEK_MARKERS = ("<｜tool▁call▁begin｜>", "<｜tool▁calls▁begin｜>")
_DS_BEGIN = re.compile(r"<｜tool▁call▁begin｜>")
_DS_END = re.compile(r"<｜tool▁call▁end｜>")
_DS_SEP = "<｜tool▁sep｜>"
_DS_SECTION = re.compile(r"<｜tool▁calls▁(?:begin|end)｜>")


def scan_deepseek(text: str, ctx: Context, final: bool) -> list[Hit]:
    hits: list[Hit] = []
    begins = list(_DS_BEGIN.finditer(text))
    for idx, m in enumerate(begins):
        limit = begins[idx + 1].start() if idx + 1 < len(begins) else len(text)
        end_m = _DS_END.search(text, m.end(), limit)
        if end_m is None and not final:
            hits.append(Hit(m.start(), len(text), complete=False))
            break
        body = text[m.end() : end_m.start() if end_m else limit]
        end = end_m.end() if end_m else limit
        left, sep, right = body.partition(_DS_SEP)
        if not sep:
            hits.append(Hit(m.start(), end, bad_reason="DeepSeek call without <｜tool▁sep｜>", keep_text=True))
            continue
        if left.strip() == "function":  # V3: type, sep, name on the first line, then fenced arguments
            name, _, rest = right.partition("\n")
            at = rest.find("```")
            if at >= 0:
                blocks, unclosed = fenced_blocks(rest, at)
                args = blocks[0] if blocks else (unclosed or "")
            else:
                args = rest
        else:  # V3.1: name, sep, arguments
            name, args = left, right
        name = name.strip()
        if not name:
            hits.append(Hit(m.start(), end, bad_reason="DeepSeek call without a function name", keep_text=True))
            continue
        hits.append(Hit(m.start(), end, RawCall(name, args.strip())))
    hits.extend(Hit(s.start(), s.end()) for s in _DS_SECTION.finditer(text))
    return hits
