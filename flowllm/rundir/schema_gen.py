"""The JSON Schema of the run folder's records, generated from their dataclasses (flowllm/rundir/results.py).

The schemas ship in ``flowllm/rundir/schema/`` for other tools to validate run files with; a test checks that
the shipped files equal what this module generates. After changing a record, write them again:

    python -m flowllm.rundir.schema_gen
"""

from __future__ import annotations

import inspect
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from flowllm.rundir.record_base import KEY, Record, record_fields
from flowllm.rundir.results import LedgerLine, RunSummary, TaskResult

__all__ = ["SCHEMAS", "SCHEMA_DIR", "render", "schema_of", "write_schemas"]

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
# file name -> the record it describes (``usage.jsonl``: each line).
SCHEMAS: dict[str, type[Record]] = {
    "summary.schema.json": RunSummary,
    "result.schema.json": TaskResult,
    "usage-line.schema.json": LedgerLine,
}
_SIMPLE: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}


def _type(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    if hint is Any:
        return {}
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if isinstance(hint, type) and issubclass(hint, Record):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # reserved first: a record that names itself ends here
            defs[hint.__name__] = _object(hint, defs)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if all(a in _SIMPLE for a in args):
            return {"type": [_SIMPLE[a] for a in args]}
        return {"anyOf": [_type(a, defs) for a in args]}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type(args[1], defs) if args else {}}
    if origin is list:
        return {"type": "array", "items": _type(args[0], defs) if args else {}}
    raise TypeError(f"no JSON Schema for {hint!r}: give the record's field a JSON type")


def _object(cls: type[Record], defs: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties = {}
    for f in record_fields(cls):
        key = f.metadata.get(KEY, f.name)
        properties[key] = _type(hints[f.name], defs)
    required = list(getattr(cls, "REQUIRED", ()))
    return {
        "title": cls.__name__,
        "description": _first_paragraph(cls),
        "type": "object",
        "properties": properties,
        **({"required": required} if required else {}),
        # Older and newer files have keys this version does not know: they are kept, never refused.
        "additionalProperties": True,
    }


def _first_paragraph(cls: type) -> str:
    return " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())


def schema_of(cls: type[Record]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``cls``, its nested records under ``$defs``."""
    defs: dict[str, Any] = {}
    body = _object(cls, defs)
    out: dict[str, Any] = {"$schema": DIALECT, "$id": f"flowllm:{cls.__name__}", **body}
    if defs:
        out["$defs"] = dict(sorted(defs.items()))
    return out


def render(cls: type[Record]) -> str:
    """The schema file's text, as shipped."""
    return json.dumps(schema_of(cls), indent=2, ensure_ascii=False) + "\n"


def write_schemas(folder: Path = SCHEMA_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, cls in SCHEMAS.items():
        path = folder / name
        path.write_text(render(cls), encoding="utf-8")
        written.append(path)
    return written


def main() -> int:
    for path in write_schemas():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
