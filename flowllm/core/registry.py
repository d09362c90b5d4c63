"""Named implementations of one kind, chosen by a config value: the one way flowllm registers them.

Runners (``runner=``), wire protocols (``provider.protocol``), dataset adapters (``dataset.adapter``), scorers
(``dataset.scorer``), judge templates (``judge.template``), repair stages (``repair.stages``) and tool-call
formats (``formats`` of the parse_tool_calls node) each keep a ``Registry``. Built-ins are registered where they
are defined; an installed package adds its own through an entry point of the registry's group (``flowllm.scorers``
...), read once, on the first lookup of that registry. A name that is none of them gets one line listing the
choices, with the closest one when the name looks misspelt (``unknown_choice``).

(Pipeline nodes are chosen differently on purpose: by import path, ``_target_``, so any class can be one and a
plug-in's node needs no entry point.)
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from flowllm.errors import ConfigError, PluginError

T = TypeVar("T")
E = TypeVar("E", bound=Enum)
ErrorFactory = Callable[[str], Exception]
# Turns what a plug-in's entry point loads into the registry's item (a bare function into a repair Stage...);
# raises TypeError or ValueError when the object cannot be one.
Adapter = Callable[[str, Any], T]


def unknown_choice(key: str, name: object, choices: Iterable[str]) -> str:
    """The one message for a name that is none of ``choices``: ``key must be one of a, b, not 'x' (did you
    mean 'a'?)``; the hint only when a choice is close to the name."""
    names = list(choices)
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{key} must be one of {', '.join(names)}, not '{name}'{hint}"


class Registry(Generic[T]):
    """Name -> implementation, for the config key ``key`` (used in messages).

    ``group``: the entry-point group plug-ins register under (None: built-ins only). ``error``: what ``require``
    raises by default. ``adapt``: turns a plug-in's loaded object into an item.
    """

    def __init__(
        self,
        key: str,
        entries: dict[str, T] | None = None,
        *,
        group: str | None = None,
        error: ErrorFactory = ConfigError,
        adapt: Adapter[T] | None = None,
    ) -> None:
        self.key = key
        self.group = group
        self.error = error
        self._entries: dict[str, T] = dict(entries or {})
        self._adapt = adapt
        self._discovered = group is None
        self._failure: PluginError | None = None  # a plug-in that failed to load: said at every lookup
        self._lock = threading.Lock()

    @classmethod
    def of_enum(cls, key: str, enum: type[E], *, error: ErrorFactory = ConfigError) -> Registry[E]:
        """The members of ``enum`` by value: a closed choice, with the same message as every other."""
        return Registry(key, {str(member.value): member for member in enum}, error=error)

    def register(self, name: str, item: T) -> None:
        """Add ``item`` under ``name``; registering the same item again is harmless, another one is refused."""
        current = self._entries.get(name)
        if current is not None and current is not item:
            raise ValueError(f"{self.key}: '{name}' is registered already")
        self._entries[name] = item

    def get(self, name: str) -> T | None:
        if not self._discovered:
            self._discover()
        return self._entries.get(name)

    def require(self, name: str, error: ErrorFactory | None = None, *, key: str | None = None) -> T:
        """The implementation named ``name``; else ``error`` (default: the registry's) is raised with the choices
        listed and the closest one suggested. ``key``: the setting to name when it is not the registry's key."""
        item = self.get(name)
        if item is None:
            raise (error or self.error)(unknown_choice(key or self.key, name, self))
        return item

    def names(self) -> list[str]:
        return sorted(self)

    def choices(self) -> str:
        """The names in the order they were registered (built-ins first, then plug-ins), for messages."""
        return ", ".join(self)

    def items(self) -> list[tuple[str, T]]:
        if not self._discovered:
            self._discover()
        return list(self._entries.items())

    def values(self) -> list[T]:
        return [item for _, item in self.items()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[str]:
        if not self._discovered:
            self._discover()
        return iter(list(self._entries))

    def __len__(self) -> int:
        if not self._discovered:
            self._discover()
        return len(self._entries)

    def _discover(self) -> None:
        """Register the plug-ins of ``group``, once (a second thread waits for the first to finish)."""
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if self._discovered or self.group is None:
                return
            try:
                for point in entry_points(group=self.group):
                    self._add_plugin(point)
            except PluginError as exc:
                self._failure = exc
                raise
            self._discovered = True

    def _add_plugin(self, point: EntryPoint) -> None:
        dist = point.dist.name if point.dist is not None else "an unknown distribution"
        where = f"plug-in '{point.name}' ({point.group} = {point.value}, from {dist})"
        try:
            loaded = point.load()
        except Exception as exc:  # any failure of a third party's import: one line naming who to fix
            reason = (str(exc).strip().splitlines() or [""])[0]
            raise PluginError(
                f"{where} failed to load: {type(exc).__name__}: {reason} (fix or uninstall {dist})"
            ) from None
        try:
            item = self._adapt(point.name, loaded) if self._adapt is not None else loaded
        except (TypeError, ValueError) as exc:
            raise PluginError(f"{where} is no {self.key} entry: {exc}") from None
        current = self._entries.get(point.name)
        if current is not None and current is not item:
            raise PluginError(f"{where}: {self.key} '{point.name}' exists already; give the entry point another name")
        self._entries[point.name] = item
