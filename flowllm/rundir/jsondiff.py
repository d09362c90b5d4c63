"""Where two JSON values first differ, as a path a person can follow (``messages[2].content[0].text``)."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

# Keys whose values differ between two live runs of the same conversation without meaning anything:
# server-made ids (msg_..., chatcmpl-..., toolu_...) and the ones copied from them, and clock readings.
VOLATILE_KEYS: frozenset[str] = frozenset(
    {
        "id",
        "tool_use_id",
        "call_id",
        "created",
        "created_at",
        "system_fingerprint",
        "started_at",
        "duration_s",
        "wall_seconds",
        "item_id",
        "response_id",
        "sequence_number",
    }
)


@dataclass(frozen=True)
class Difference:
    path: str
    left: Any
    right: Any
    missing: str | None = None  # "left" or "right" when the key or item exists on one side only

    def describe(self, limit: int = 120) -> str:
        where = self.path or "(the whole value)"
        if self.missing == "left":
            return f"{where}: only in the second ({short(self.right, limit)})"
        if self.missing == "right":
            return f"{where}: only in the first ({short(self.left, limit)})"
        if isinstance(self.left, str) and isinstance(self.right, str):
            return f"{where}: {string_difference(self.left, self.right, limit // 2)}"
        return f"{where}: {short(self.left, limit)} vs {short(self.right, limit)}"


def string_difference(left: str, right: str, context: int = 60) -> str:
    """Two strings that differ, shown from shortly before the first differing character."""
    common = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        common += 1
    start = max(0, common - context // 3)
    prefix = "..." if start else ""
    return f"at character {common}: {prefix}{short(left[start:], context)} vs {prefix}{short(right[start:], context)}"


def short(value: Any, limit: int = 120) -> str:
    """A one-line rendering of a value, cut at ``limit`` characters."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=repr)
        except (TypeError, ValueError):
            text = repr(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def first_difference(left: Any, right: Any, ignore: Collection[str] = (), path: str = "") -> Difference | None:
    """The first place (depth first, in key order of ``left``) where ``left`` and ``right`` differ.

    Keys listed in ``ignore`` are skipped wherever they appear. Two strings that differ are reported at the
    string, with both values, so the caller can show the offset itself if it wants.
    """
    if isinstance(left, dict) and isinstance(right, dict):
        for key in left:
            if key in ignore:
                continue
            if key not in right:
                return Difference(_join(path, str(key)), left[key], None, missing="right")
            found = first_difference(left[key], right[key], ignore, _join(path, str(key)))
            if found:
                return found
        for key in right:
            if key not in ignore and key not in left:
                return Difference(_join(path, str(key)), None, right[key], missing="left")
        return None
    if isinstance(left, list) and isinstance(right, list):
        for i, (a, b) in enumerate(zip(left, right, strict=False)):
            found = first_difference(a, b, ignore, f"{path}[{i}]")
            if found:
                return found
        if len(left) > len(right):
            return Difference(f"{path}[{len(right)}]", left[len(right)], None, missing="right")
        if len(right) > len(left):
            return Difference(f"{path}[{len(left)}]", None, right[len(left)], missing="left")
        return None
    # bool is an int in Python: 1 == True must still count as a difference in JSON.
    if type(left) is not type(right) and not (
        isinstance(left, (int, float))
        and isinstance(right, (int, float))
        and not isinstance(left, bool)
        and not isinstance(right, bool)
    ):
        return Difference(path, left, right)
    return None if left == right else Difference(path, left, right)
