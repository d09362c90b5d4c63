"""What every tool-call format shares: the hit it reports, the context it reads, and small helpers.

A text format scans the reply and returns ``Hit``s: where a call (or a malformed call) sits in the text, what it
says, and whether it is complete. ``parse_tool_calls`` merges the hits of all formats, orders them, numbers the
calls and cuts them out of the text. ``complete=False`` matters only while streaming: an unfinished block is
held back until more text arrives, and mended only when the reply has ended.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from flowllm.parsing.repair import repair_json
from flowllm.parsing.repair.stages import loads_strict


@dataclass(slots=True)
class RawCall:
    name: str
    arguments_text: str
    server: str | None = None
    id: str | None = None  # a provider's own id (native formats); text formats get call_<n>


@dataclass(slots=True)
class Hit:
    start: int
    end: int
    call: RawCall | None = None
    bad_reason: str | None = None
    complete: bool = True
    keep_text: bool = False  # a malformed block's text stays in the content the model sees


@dataclass(slots=True)
class Context:
    """What the caller knows about the tools: server names, and per tool name its input schema."""

    servers: tuple[str, ...] = ()
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    known_tools: frozenset[str] | None = None

    @classmethod
    def build(cls, servers: Iterable[str] | None, tools: Any) -> Context:
        schemas: dict[str, dict[str, Any]] = {}
        known: set[str] | None = None
        if tools is not None:
            known = set()
            items: Iterable[Any] = tools.items() if isinstance(tools, Mapping) else tools
            for item in items:
                if isinstance(item, tuple):  # mapping of name -> schema
                    name, schema = item
                elif isinstance(item, Mapping):  # a ToolSpec
                    name, schema = item.get("name", ""), item.get("input_schema") or {}
                else:
                    name, schema = str(item), {}
                known.add(str(name))
                if isinstance(schema, Mapping):
                    schemas[str(name)] = dict(schema)
        # Longest first, so "tool-python-extra" wins over "tool-python" when both are servers.
        ordered = tuple(sorted({s for s in servers or () if s}, key=len, reverse=True))
        return cls(ordered, schemas, frozenset(known) if known is not None else None)


# A text format's reader: (text, context, final, the enabled format names) -> the calls it found, as spans of
# the text. ``final`` is False while a stream is still arriving: an unclosed block is then ``complete=False``.
Scanner = Callable[[str, Context, bool, frozenset[str]], list[Hit]]


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """One tool-call format ``formats`` may name: a text format's ``scanner`` and the ``markers`` that must
    appear in the text for it to run (none: a markerless format, tried only when no marked format found a
    call); a native format (a provider's own tool-call list) has no scanner."""

    scanner: Scanner | None
    markers: tuple[str, ...] = ()


def split_server(name: str, ctx: Context, *, native: bool) -> tuple[str | None, str]:
    """``server-tool`` -> (server, tool): after the longest known server the name starts with; with no known
    servers, native names split on the last '-' (how native tools are registered); text names stay whole."""
    for server in ctx.servers:
        if name.startswith(server + "-") and len(name) > len(server) + 1:
            return server, name[len(server) + 1 :]
    if native and not ctx.servers and "-" in name.strip("-"):
        server, _, tool = name.rpartition("-")
        return server, tool
    return None, name


def dumps(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):  # integers beyond 64 bits, non-string keys
        return json.dumps(value, ensure_ascii=False)


def arguments_to_text(args: Any) -> str:
    """The arguments of a call object as JSON text for ``repair_arguments``.

    A string that holds a JSON object is used as it is (decoded once: Granite-style serialized arguments);
    any other string is kept as a JSON string, so ``repair_arguments`` reports it as ``{"value": ...}``
    instead of silently reading something else into it.
    """
    if args is None:
        return "{}"
    if isinstance(args, str):
        try:
            if isinstance(loads_strict(args), dict):
                return args
        except ValueError:
            pass
        return dumps(args)
    return dumps(args)


_NAME_KEYS = ("name", "tool_name", "tool", "function_name")
_ARG_KEYS = ("arguments", "parameters", "args", "input", "tool_input")
_SERVER_KEYS = ("server_name", "server")


def call_from_object(obj: Any, *, require_arguments: bool) -> RawCall | None:
    """A call from a JSON object shaped like one (``{"name": ..., "arguments"|"parameters": ...}``), or None."""
    if not isinstance(obj, dict):
        return None
    fn = obj.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):  # {"type": "function", "function": {...}}
        obj = {**fn, **{k: v for k, v in obj.items() if k in _SERVER_KEYS}}
    name = _first_text(obj, _NAME_KEYS)
    if name is None:
        return None
    arg_key = None
    for k in _ARG_KEYS:
        if k in obj:
            arg_key = k
            break
    if arg_key is None and require_arguments:
        return None
    server = _first_text(obj, _SERVER_KEYS)
    args = obj[arg_key] if arg_key else None
    if is_echoed_schema(obj, args):
        return None
    return RawCall(name, arguments_to_text(args), server)


def is_echoed_schema(obj: dict[str, Any], args: Any) -> bool:
    """A tool definition the model repeated (``{"name", "description", "parameters": {JSON schema}}``), not a
    call: its "arguments" would be the schema itself."""
    return (
        "description" in obj
        and isinstance(args, dict)
        and "properties" in args
        and args.get("type") in ("object", "OBJECT")
    )


def echoes_schemas(text: str) -> bool:
    """Whether JSON text is one tool definition, or a list of them, repeated by the model (no call in it)."""
    try:
        value = loads_strict(text)
    except ValueError:
        return False
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(_is_definition(item) for item in items)


def _is_definition(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    fn = item.get("function")
    obj = fn if isinstance(fn, dict) else item
    return isinstance(obj, dict) and is_echoed_schema(obj, obj.get("parameters", obj.get("input_schema")))


def _first_text(obj: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for k in keys:
        v = obj.get(k)
        if type(v) is str and v.strip():
            return v.strip()
    return None


_RAW_ARGS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


def raw_arguments(block: str) -> str | None:
    """The arguments text of a malformed call object, as the model wrote it (for ``repair_arguments``).

    Only for the usual layout, name first and arguments last: the text after ``"arguments":`` less the call
    object's own closing brace. None when the layout is different.
    """
    m = _RAW_ARGS.search(block)
    if m is None or block.find('"name"') > m.start() or block.find('"name"') < 0:
        return None
    rest = block[m.end() :].rstrip()
    if rest.endswith("}") and rest.count("{") < rest.count("}"):
        rest = rest[:-1].rstrip()
    return rest


def parse_call_object(block: str, *, require_arguments: bool) -> tuple[list[RawCall], str | None]:
    """Calls from JSON text holding one call object, a list of them, or several separated by commas.

    Returns (calls, error). Clean JSON is read strictly; broken JSON is repaired to find the calls, but the
    arguments of a call keep the model's own text when it can be cut out, so ``repair_arguments`` (and its
    configured stages) still decides how they are read, and records how.
    """
    text = block.strip()
    try:
        value = loads_strict(text)
        repaired = False
    except ValueError:
        value = _MISSING_VALUE
    if value is _MISSING_VALUE and text[:1] == "{":
        try:  # {...}, {...}: several call objects in one block
            value = loads_strict("[" + text + "]")
            repaired = False
        except ValueError:
            pass
    if value is _MISSING_VALUE:
        r = repair_json(text)
        if not r.ok:
            return [], r.error
        value, repaired = r.value, True
    items = value if isinstance(value, list) else [value]
    calls = [c for c in (call_from_object(v, require_arguments=require_arguments) for v in items) if c]
    if not calls:
        return [], "no call object with a name and arguments"
    if repaired and len(calls) == 1:
        raw = raw_arguments(text)
        if raw is not None:
            calls[0].arguments_text = raw
    return calls, None


def schema_for(ctx: Context, tool: str) -> dict[str, Any]:
    schema = ctx.schemas.get(tool) or {}
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}


def _allowed_types(prop: Mapping[str, Any]) -> list[str]:
    types: list[str] = []
    t = prop.get("type")
    if isinstance(t, str):
        types.append(_TYPE_ALIASES.get(t, t))
    elif isinstance(t, list):
        types.extend(_TYPE_ALIASES.get(x, x) for x in t if isinstance(x, str))
    for key in ("anyOf", "oneOf"):
        for sub in prop.get(key) or ():
            if isinstance(sub, Mapping):
                types.extend(_allowed_types(sub))
    return types


_TYPE_ALIASES = {"float": "number", "double": "number", "int": "integer", "bool": "boolean", "str": "string",
                 "text": "string", "dict": "object", "list": "array"}  # fmt: skip
_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def _type_of(value: Any, names: Sequence[str]) -> bool:
    for n in names:
        py = _JSON_TYPES.get(n)
        if py is None:
            continue
        if isinstance(value, bool) and n in ("integer", "number"):
            continue
        if isinstance(value, py):
            return True
    return False


def coerce_parameter(text: str, prop: Mapping[str, Any] | None) -> Any:
    """A parameter written as plain text (XML formats) as the JSON value its schema asks for.

    With no schema a value that reads as JSON other than a string (42, true, {"a": 1}) takes that type and
    anything else stays text. With a schema, a string-typed parameter stays exactly as written ("007" is
    not 7), and other types are read as JSON, repaired if need be.
    """
    types = _allowed_types(prop) if prop else []
    if types == ["string"] or (types and set(types) <= {"string", "null"} and text != "null"):
        return text
    try:
        value = loads_strict(text)
    except ValueError:
        value = _NOT_JSON
    if value is not _NOT_JSON and (not types or _type_of(value, types)) and (types or not isinstance(value, str)):
        return value
    if types:
        low = text.strip().lower()
        if ("integer" in types or "number" in types) and _INT_TEXT.match(low):
            return int(low)  # "007" is not JSON, but it is the integer 7
        if "number" in types and _FLOAT_TEXT.match(low):
            return float(low)
        if "boolean" in types and low in ("true", "false", "yes", "no"):
            return low in ("true", "yes")
        if ("object" in types or "array" in types) and text.strip()[:1] in ("{", "["):
            r = repair_json(text)
            if r.ok and _type_of(r.value, types):
                return r.value
        if "null" in types and low in ("null", "none"):
            return None
    return text


_NOT_JSON = object()
_MISSING_VALUE = object()
_INT_TEXT = re.compile(r"[-+]?\d+\Z")
_FLOAT_TEXT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?\Z")
