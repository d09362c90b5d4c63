"""Check tool arguments against a tool's JSON Schema before the call leaves the pool.

MCP servers describe their inputs with JSON Schema. Catching a wrong argument here gives the model one clear
message naming every problem, instead of whatever the server's own validation prints (pydantic's text, or
nothing at all for servers that do not validate). ``jsonschema`` is not a declared dependency, so this is a
small validator for the subset MCP tool schemas use:

``type`` (one or a list), ``required``, ``properties``, ``additionalProperties`` (``false`` or a schema),
``items``, ``enum``, ``const``, ``anyOf``/``oneOf``/``allOf``, local ``$ref`` (``#/$defs/...``, what pydantic
emits for nested models), ``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum``,
``minLength``/``maxLength`` and ``minItems``/``maxItems``.

Keywords outside that subset are ignored (the server still validates), so an unfamiliar schema can only make
this check more permissive, never reject a valid call.
"""

from __future__ import annotations

import json
from typing import Any

_MAX_ERRORS = 10


def _type_matches(value: Any, type_name: str) -> bool:
    # bool is a subclass of int in Python but a separate type in JSON.
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if type_name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if type_name == "boolean":
        return isinstance(value, bool)
    if type_name == "array":
        return isinstance(value, list)
    if type_name == "object":
        return isinstance(value, dict)
    if type_name == "null":
        return value is None
    return True  # an unknown type name: do not guess, let the server decide


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(path: str) -> str:
    return f"argument '{path}'" if path else "the arguments"


class _Validator:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.errors: list[str] = []

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any] | None:
        ref = schema.get("$ref")
        seen: set[str] = set()
        while isinstance(ref, str):
            if not ref.startswith("#/") or ref in seen:
                return None  # remote or cyclic reference: skip rather than guess
            seen.add(ref)
            node: Any = self.root
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(node, dict) or part not in node:
                    return None
                node = node[part]
            if not isinstance(node, dict):
                return None
            # Sibling keywords next to $ref still apply (draft 2019+); merge them over the target.
            schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
            ref = node.get("$ref")
        return schema

    def check(self, value: Any, schema: Any, path: str) -> bool:
        """Validate ``value``; record messages; return whether it passed."""
        if schema is False:
            self.errors.append(f"{_where(path)} is not allowed")
            return False
        if not isinstance(schema, dict):
            return True
        resolved = self._resolve(schema) if "$ref" in schema else schema
        if resolved is None:
            return True
        schema = resolved
        before = len(self.errors)

        if "anyOf" in schema or "oneOf" in schema:
            branches = schema.get("anyOf") or schema.get("oneOf") or []
            if branches and not any(self._quiet_check(value, b, path) for b in branches):
                # Branch order, duplicates dropped: 'string or null' reads as the schema was written.
                kinds = list(
                    dict.fromkeys(_describe_type(self._resolve(b) or {}) for b in branches if isinstance(b, dict))
                )
                self.errors.append(
                    f"{_where(path)} must be {' or '.join(k for k in kinds if k) or 'an allowed form'}, "
                    f"got {_json_type(value)} {_short(value)}"
                )
                return False
        for sub in schema.get("allOf", []) or []:
            self.check(value, sub, path)

        expected = schema.get("type")
        if expected is not None:
            names = expected if isinstance(expected, list) else [expected]
            if not any(_type_matches(value, str(n)) for n in names):
                wanted = " or ".join(map(str, names))
                self.errors.append(f"{_where(path)} must be {wanted}, got {_json_type(value)} {_short(value)}")
                return False

        if "enum" in schema and isinstance(schema["enum"], list) and not _in_enum(value, schema["enum"]):
            allowed = ", ".join(_short(v, 30) for v in schema["enum"])
            self.errors.append(f"{_where(path)} must be one of {allowed}; got {_short(value)}")
        if "const" in schema and not _in_enum(value, [schema["const"]]):
            self.errors.append(f"{_where(path)} must be {_short(schema['const'])}; got {_short(value)}")

        if isinstance(value, int | float) and not isinstance(value, bool):
            self._check_bounds(value, schema, path)
        if isinstance(value, str):
            if isinstance(schema.get("minLength"), int) and len(value) < schema["minLength"]:
                self.errors.append(f"{_where(path)} must have at least {schema['minLength']} characters")
            if isinstance(schema.get("maxLength"), int) and len(value) > schema["maxLength"]:
                self.errors.append(f"{_where(path)} must have at most {schema['maxLength']} characters")
        if isinstance(value, list):
            self._check_array(value, schema, path)
        if isinstance(value, dict):
            self._check_object(value, schema, path)
        return len(self.errors) == before

    def _quiet_check(self, value: Any, schema: Any, path: str) -> bool:
        saved = self.errors
        self.errors = []
        try:
            return self.check(value, schema, path)
        finally:
            self.errors = saved

    def _check_bounds(self, value: float, schema: dict[str, Any], path: str) -> None:
        for key, ok, word in (
            ("minimum", lambda v, b: v >= b, ">="),
            ("maximum", lambda v, b: v <= b, "<="),
            ("exclusiveMinimum", lambda v, b: v > b, ">"),
            ("exclusiveMaximum", lambda v, b: v < b, "<"),
        ):
            bound = schema.get(key)
            if isinstance(bound, int | float) and not isinstance(bound, bool) and not ok(value, bound):
                self.errors.append(f"{_where(path)} must be {word} {bound}, got {_short(value)}")

    def _check_array(self, value: list[Any], schema: dict[str, Any], path: str) -> None:
        if isinstance(schema.get("minItems"), int) and len(value) < schema["minItems"]:
            self.errors.append(f"{_where(path)} must have at least {schema['minItems']} items")
        if isinstance(schema.get("maxItems"), int) and len(value) > schema["maxItems"]:
            self.errors.append(f"{_where(path)} must have at most {schema['maxItems']} items")
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                if len(self.errors) >= _MAX_ERRORS:
                    return
                self.check(item, items, f"{path}[{i}]")

    def _check_object(self, value: dict[str, Any], schema: dict[str, Any], path: str) -> None:
        prefix = f"{path}." if path else ""
        for name in schema.get("required", []) or []:
            if name not in value:
                prop = (schema.get("properties") or {}).get(name)
                kind = _describe_type(self._resolve(prop) or {}) if isinstance(prop, dict) else ""
                self.errors.append(f"missing required argument '{prefix}{name}'" + (f" ({kind})" if kind else ""))
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if len(self.errors) >= _MAX_ERRORS:
                return
            if name in properties:
                self.check(item, properties[name], f"{prefix}{name}")
            elif extra is False:
                known = ", ".join(sorted(properties)) or "none"
                self.errors.append(f"unknown argument '{prefix}{name}' (accepted: {known})")
            elif isinstance(extra, dict):
                self.check(item, extra, f"{prefix}{name}")


def _in_enum(value: Any, allowed: list[Any]) -> bool:
    # JSON equality: True is not 1, 1 equals 1.0.
    return any((isinstance(value, bool) == isinstance(choice, bool)) and value == choice for choice in allowed)


def _describe_type(schema: dict[str, Any]) -> str:
    t = schema.get("type")
    if isinstance(t, list):
        return " or ".join(map(str, t))
    if isinstance(t, str):
        return t
    if "enum" in schema:
        return "one of " + ", ".join(_short(v, 20) for v in schema["enum"])
    return ""


def validate_arguments(arguments: Any, schema: dict[str, Any] | None) -> list[str]:
    """Return the problems of ``arguments`` against ``schema`` (empty when they are valid).

    Messages name the argument path (``'rows[2].name'``) and say what was expected and what arrived, so the
    model can fix its call without seeing the schema again. At most ten problems are reported.
    """
    if not isinstance(arguments, dict):
        return [f"the arguments must be a JSON object, got {_json_type(arguments)} {_short(arguments)}"]
    if not schema:
        return []
    validator = _Validator(schema)
    validator.check(arguments, schema, "")
    return validator.errors[:_MAX_ERRORS]


def describe_signature(schema: dict[str, Any] | None) -> str:
    """A one-line summary of a tool's arguments, e.g. ``code: string (required), timeout_s: number``."""
    if not schema:
        return "no arguments"
    props = schema.get("properties") or {}
    if not props:
        return "no arguments"
    required = set(schema.get("required") or [])
    validator = _Validator(schema)
    parts = []
    for name, prop in props.items():
        kind = _describe_type(validator._resolve(prop) or {}) if isinstance(prop, dict) else ""
        if not kind and isinstance(prop, dict) and ("anyOf" in prop or "oneOf" in prop):
            kinds = [
                _describe_type(validator._resolve(b) or {})
                for b in prop.get("anyOf") or prop.get("oneOf") or []
                if isinstance(b, dict)
            ]
            kind = " or ".join(k for k in kinds if k)
        parts.append(f"{name}: {kind or 'any'}" + (" (required)" if name in required else ""))
    return ", ".join(parts)
