"""Python literal syntax to JSON values, through the ``ast`` module (never ``eval``).

Shared by the ``python`` repair stage and the pythonic tool-call format (``[f(a=1, b=None)]``). Sets and tuples
become lists in source order (``ast`` keeps it, ``literal_eval`` would not for sets); JSON's own ``true``,
``false`` and ``null`` are accepted too, because models mix the two. Anything that has no JSON equivalent
(bytes, non-finite floats, names, calls, ``...``) is refused with ``NotJSON`` rather than guessed at.
"""

from __future__ import annotations

import ast
import math
from typing import Any

_NAMES = {"true": True, "false": False, "null": None, "None": None, "True": True, "False": False}


class NotJSON(ValueError):
    """A Python expression with no faithful JSON value."""


def to_json_value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise NotJSON(f"non-finite number {value!r}")
            return value
        raise NotJSON(f"{type(value).__name__} literal")
    if isinstance(node, ast.Dict):
        out: dict[str, Any] = {}
        for k, v in zip(node.keys, node.values, strict=True):
            if k is None:
                raise NotJSON("** unpacking")
            key = to_json_value(k)
            if isinstance(key, dict | list):
                raise NotJSON("unhashable key")
            out[key if isinstance(key, str) else _key_text(key)] = to_json_value(v)
        return out
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [to_json_value(e) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = to_json_value(node.operand)
        if isinstance(inner, bool) or not isinstance(inner, int | float):
            raise NotJSON("sign on a non-number")
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    raise NotJSON(f"{type(node).__name__} is not a literal")


def _key_text(key: Any) -> str:
    # The same spelling json.dumps gives a non-string key.
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    return str(key)


def parse_python_literal(text: str) -> Any:
    """The JSON value of a Python literal expression; raises ``SyntaxError``/``NotJSON``/``ValueError``."""
    tree = ast.parse(text.strip(), mode="eval")
    return to_json_value(tree.body)
