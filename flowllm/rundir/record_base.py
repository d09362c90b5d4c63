"""Typed JSON records: a dataclass read from and written to a JSON object, tolerant of older and newer files.

``Record.from_dict`` reads every key it knows into its field (a nested record, or a mapping or list of them,
is read as one) and keeps every key it does not know in ``extra``; a missing key takes the field's default.
``to_dict`` writes the object back: a record read from a file writes the keys the file had (and any field
since set to something other than its default), so an older file round-trips unchanged; a record built in
code writes every field but those ``omitted_keys`` names (by default the fields marked ``OPTIONAL`` left at
their default). Field names are the JSON keys, unless a field's metadata gives ``KEY`` (``from`` is a keyword).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Hashable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, Self, TypeVar

from flowllm.errors import CliError

__all__ = ["KEY", "OPTIONAL", "Record", "RecordFormatError", "record_fields", "record_type"]

R = TypeVar("R", bound="Record")
_INTERNAL = "record_internal"
KEY = "key"  # metadata: the field's JSON key, where it is not a Python name (``from``)
# metadata: a record built in code leaves the field out of its JSON while it holds its default.
OPTIONAL: dict[str, Any] = {"optional": True}


class RecordFormatError(CliError, ValueError):
    """A run file's record is not a JSON object (the file is not one flowllm wrote, or it was cut short)."""


@dataclass(kw_only=True)
class Record:
    """Base of the run folder's records; see the module's docstring."""

    # Keys this version does not know, kept as they were so a round trip loses nothing.
    extra: dict[str, Any] = field(default_factory=dict, metadata={_INTERNAL: True})
    # The JSON keys of the file it was read from; None for a record built in code.
    loaded_keys: frozenset[str] | None = field(default=None, compare=False, repr=False, metadata={_INTERNAL: True})

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        if not isinstance(data, dict):
            raise RecordFormatError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        values: dict[str, Any] = {}
        for slot in _slots(cls):
            if slot.key in data:
                value = data[slot.key]
                values[slot.name] = _read(slot.hint, value) if slot.nested else value
        known = _by_key(cls)
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**values, extra=extra, loaded_keys=frozenset(data))

    @classmethod
    def coerce(cls, value: Self | Mapping[str, Any]) -> Self:
        """``value`` as a record: itself, or read from a mapping (a caller that still holds a dict)."""
        return value if isinstance(value, cls) else cls.from_dict(dict(value))  # type: ignore[arg-type]

    def merge(self, data: Mapping[str, Any]) -> None:
        """Set the fields ``data`` names, read as ``from_dict`` reads them (a block of keys a builder returned);
        keys the record does not know go to ``extra``."""
        slots = _by_key(type(self))
        for key, value in data.items():
            slot = slots.get(key)
            if slot is None:
                self.extra[key] = value
            else:
                setattr(self, slot.name, _read(slot.hint, value) if slot.nested else value)

    def omitted_keys(self) -> set[str]:
        """The keys a record built in code leaves out: ``optional`` fields at their default."""
        return {slot.key for slot in _optional_slots(type(self)) if getattr(self, slot.name) == slot.default()}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        loaded = self.loaded_keys
        omitted = self.omitted_keys() if loaded is None else ()
        for slot in _slots(type(self)):
            key = slot.key
            value = getattr(self, slot.name)
            if loaded is None:
                if key in omitted:
                    continue
            elif key not in loaded and value == slot.default():
                continue
            out[key] = value if type(value) in _PLAIN else _write(value)
        if self.extra:
            out.update(_write(self.extra))
        return out


def record_fields(cls: type[Record]) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of a record class that are JSON keys, in the order they are written."""
    return _fields(typing.cast(Hashable, cls))


@functools.cache
def _fields(cls: Any) -> tuple[dataclasses.Field[Any], ...]:  # read once per class
    return tuple(f for f in dataclasses.fields(cls) if not f.metadata.get(_INTERNAL))


# Values written as they are (no record, mapping or list inside to convert).
_PLAIN = frozenset({str, int, float, bool, type(None)})
# Default factories whose every call returns an equal, empty value: one made value stands for all of them.
_EMPTY_FACTORIES = frozenset({dict, list, set, tuple, frozenset})


@dataclass(frozen=True)
class _Slot:
    """One field as ``from_dict`` and ``to_dict`` read it, worked out once per class: its name, JSON key, default
    and type."""

    name: str
    key: str
    optional: bool
    field: dataclasses.Field[Any]
    fixed: Any  # the default when it is one value (a plain default, or an empty factory's); else MISSING
    hint: Any  # the field's type
    nested: bool  # whether the type holds records (a value read from JSON is then converted: ``_read``)

    def default(self) -> Any:
        """The field's default, to compare a value with (an empty factory's value is shared: never hand it out)."""
        fixed = self.fixed
        return fixed if fixed is not MISSING else _default(self.field)


@functools.cache
def _slots_of(cls: Any) -> tuple[_Slot, ...]:
    slots = []
    hints = _type_hints(cls)
    for f in _fields(cls):
        factory: Any = f.default_factory
        if f.default is not MISSING:
            fixed = f.default
        elif factory in _EMPTY_FACTORIES:
            fixed = factory()
        else:
            fixed = MISSING
        hint = hints[f.name]
        key, optional = f.metadata.get(KEY, f.name), bool(f.metadata.get("optional"))
        slots.append(_Slot(f.name, key, optional, f, fixed, hint, _holds_records(hint)))
    return tuple(slots)


def _slots(cls: type[Record]) -> tuple[_Slot, ...]:
    return _slots_of(typing.cast(Hashable, cls))


@functools.cache
def _by_key_of(cls: Any) -> dict[str, _Slot]:
    return {slot.key: slot for slot in _slots_of(cls)}


def _by_key(cls: type[Record]) -> dict[str, _Slot]:
    """A record class's fields by their JSON key (the keys it reads into fields; never to be changed)."""
    return _by_key_of(typing.cast(Hashable, cls))


def _holds_records(hint: Any) -> bool:
    """Whether ``_read`` converts values of type ``hint`` (a record, or a mapping or list of records)."""
    if record_type(hint) is not None:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict and len(args) == 2:
        return record_type(args[1]) is not None
    if origin is list and args:
        return record_type(args[0]) is not None
    return False


@functools.cache
def _optional_of(cls: Any) -> tuple[_Slot, ...]:
    return tuple(slot for slot in _slots_of(cls) if slot.optional)


def _optional_slots(cls: type[Record]) -> tuple[_Slot, ...]:
    return _optional_of(typing.cast(Hashable, cls))


@functools.cache
def _type_hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def record_type(hint: Any) -> type[Record] | None:
    """The record class ``hint`` names, itself or as ``X | None``; None for any other type."""
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(hint) if isinstance(a, type) and issubclass(a, Record)]
        return found[0] if len(found) == 1 else None
    return None


def _read(hint: Any, value: Any) -> Any:
    """``value`` as ``hint`` types it where it has that shape; kept as it is where it has not (an older file)."""
    cls = record_type(hint)
    if cls is not None:
        return cls.from_dict(value) if isinstance(value, dict) else value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict and len(args) == 2 and record_type(args[1]) and isinstance(value, dict):
        return {k: _read(args[1], v) for k, v in value.items()}
    if origin is list and args and record_type(args[0]) and isinstance(value, list):
        return [_read(args[0], v) for v in value]
    return value


def _write(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _write(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_write(v) for v in value]
    return value
