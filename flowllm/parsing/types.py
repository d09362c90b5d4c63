"""The data the parsing stage hands to the rest of the turn.

``ToolCall`` and ``BadToolCall`` come out of ``parse_tool_calls``; ``Repaired`` comes out of ``repair_json`` and
``repair_arguments``. The recorder writes them to ``output.json``, so each has ``to_dict``/``from_dict`` and holds
only JSON-able data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCall:
    """One tool call, whatever format it arrived in.

    ``arguments_text`` is the arguments as JSON text, not yet repaired or decoded: ``repair_arguments`` is a
    separate step so that its outcome (and the stage that fixed the text) is recorded on its own.
    ``server`` is None when the format names no server and the name matches no known one.
    """

    id: str
    server: str | None
    name: str
    arguments_text: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "server": self.server, "name": self.name, "arguments_text": self.arguments_text}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(
            id=str(data["id"]),
            server=data.get("server"),
            name=str(data["name"]),
            arguments_text=str(data.get("arguments_text", "")),
        )


@dataclass(slots=True)
class BadToolCall:
    """A block that was meant as a tool call but could not be read: reported to the model, never dropped."""

    reason: str
    raw: str

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "raw": self.raw}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BadToolCall:
        return cls(reason=str(data["reason"]), raw=str(data.get("raw", "")))


@dataclass(slots=True)
class Parsed:
    """Everything ``parse_tool_calls`` found in one model reply.

    ``content`` is the reply's text with the call blocks cut out (what the model said around its calls);
    ``formats`` names the formats that produced calls or bad calls, in order of first appearance.
    """

    calls: list[ToolCall] = field(default_factory=list)
    bad: list[BadToolCall] = field(default_factory=list)
    content: str = ""
    formats: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": [c.to_dict() for c in self.calls],
            "bad": [b.to_dict() for b in self.bad],
            "content": self.content,
            "formats": list(self.formats),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Parsed:
        return cls(
            calls=[ToolCall.from_dict(c) for c in data.get("calls", [])],
            bad=[BadToolCall.from_dict(b) for b in data.get("bad", [])],
            content=str(data.get("content", "")),
            formats=[str(f) for f in data.get("formats", [])],
        )


@dataclass(slots=True)
class Repaired:
    """The outcome of a repair chain.

    ``ok`` with ``value`` and the ``stage`` that produced it, or not ``ok`` with an ``error`` that says why.
    ``raw`` is always the text exactly as it was given, so a failure can be shown to the model verbatim.
    """

    ok: bool
    value: Any
    stage: str | None
    error: str | None
    raw: str

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "value": self.value, "stage": self.stage, "error": self.error, "raw": self.raw}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Repaired:
        return cls(
            ok=bool(data["ok"]),
            value=data.get("value"),
            stage=data.get("stage"),
            error=data.get("error"),
            raw=str(data.get("raw", "")),
        )
