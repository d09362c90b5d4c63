"""Reading a run's records back, tolerantly: a truncated file, a missing ``meta.json`` or an odd folder becomes
a *problem* attached to the record (shown to the user), never an exception that hides the rest of the run.
Node inputs and outputs are read lazily: they hold whole histories and a run can have thousands of them.

Used by replay (which serves saved replies) and by inspect (which shows them); paths come from ``layout``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from flowllm.rundir.layout import INPUT_FILE, META_FILE, NODE_RE, OUTPUT_FILE, TURN_RE

__all__ = ["Artifact", "NodeRecord", "TurnRecord", "held_exchange", "held_exchange_of", "read_artifact", "read_turns"]


def held_exchange(output: Any) -> tuple[dict[str, Any] | None, dict[str, Any]] | None:
    """The model exchange (its ``raw_request``, None when not kept, and ``raw_response``) that a node other than
    the call node made and recorded in one of its output ports (compaction's summary call); None when none."""
    for port in output.values() if isinstance(output, dict) else ():
        if isinstance(port, dict) and isinstance(port.get("raw_response"), dict):
            request = port.get("raw_request")
            return (request if isinstance(request, dict) else None), port["raw_response"]
    return None


def held_exchange_of(turn_dir: Path) -> tuple[dict[str, Any] | None, dict[str, Any], Path] | None:
    """The exchange a node of a saved turn folder holds in its output (``held_exchange``), with the node's folder;
    None when no node's output holds one."""
    try:
        folders = sorted(p for p in turn_dir.iterdir() if NODE_RE.match(p.name) and p.is_dir())
    except OSError:
        return None
    for folder in folders:
        try:
            held = held_exchange(orjson.loads((folder / OUTPUT_FILE).read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            continue
        if held is not None:
            return (*held, folder)
    return None


@dataclass
class Artifact:
    """One JSON file: its value, or why it could not be read (``error`` is None when it was read)."""

    path: Path
    value: Any = None
    error: str | None = None
    missing: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


def read_artifact(path: Path) -> Artifact:
    """Read a JSON artifact without raising: a missing, empty, truncated or non-JSON file is described."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Artifact(path, error=f"{path.name} is missing", missing=True)
    except OSError as exc:
        return Artifact(path, error=f"{path.name} cannot be read: {exc.strerror or exc}")
    if not data.strip():
        return Artifact(path, error=f"{path.name} is empty (the write was cut short)")
    try:
        return Artifact(path, value=orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        return Artifact(path, error=f"{path.name} is not valid JSON ({len(data)} bytes; truncated?): {exc}")


@dataclass
class NodeRecord:
    """One node of one turn: ``folder`` is the artifact folder name (``03_call_model``)."""

    path: Path
    index: int | None
    name: str

    @property
    def folder(self) -> str:
        return self.path.name

    @cached_property
    def meta(self) -> Artifact:
        return read_artifact(self.path / META_FILE)

    def input(self) -> Artifact:
        return read_artifact(self.path / INPUT_FILE)

    def output(self) -> Artifact:
        return read_artifact(self.path / OUTPUT_FILE)

    @property
    def status(self) -> str:
        """ok | error | unknown (no readable meta.json: an older layout, or a crash mid-write)."""
        if not self.meta.ok or not isinstance(self.meta.value, dict):
            return "unknown"
        return str(self.meta.value.get("status") or "unknown")

    @property
    def duration_s(self) -> float | None:
        value = self.meta.value.get("duration_s") if isinstance(self.meta.value, dict) else None
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def started_at(self) -> str | None:
        value = self.meta.value.get("started_at") if isinstance(self.meta.value, dict) else None
        return str(value) if value else None

    @property
    def error(self) -> str | None:
        value = self.meta.value.get("error") if isinstance(self.meta.value, dict) else None
        if value is None:
            return None
        if isinstance(value, dict):  # a provider error's to_dict()
            return str(value.get("message") or value)
        return str(value)

    @property
    def traceback(self) -> str | None:
        value = self.meta.value.get("traceback") if isinstance(self.meta.value, dict) else None
        return str(value) if value else None

    def matches(self, key: str) -> bool:
        """``call_model``, ``03``, ``3`` and ``03_call_model`` all name the same node."""
        key = key.strip()
        if key in (self.folder, self.name):
            return True
        return key.isdigit() and self.index is not None and int(key) == self.index


@dataclass
class TurnRecord:
    number: int
    path: Path
    nodes: list[NodeRecord]

    def node(self, key: str) -> NodeRecord | None:
        found = next((n for n in self.nodes if n.matches(key)), None)
        if found is None:
            # An unambiguous start of a name is enough (``repair`` for ``repair_arguments``).
            hits = [n for n in self.nodes if n.name.startswith(key)]
            found = hits[0] if len(hits) == 1 else None
        return found

    @property
    def duration_s(self) -> float:
        return sum(n.duration_s or 0.0 for n in self.nodes)


def _sort_key(path: Path) -> tuple[int, str]:
    match = NODE_RE.match(path.name)
    return (int(match.group(1)), path.name) if match else (10**6, path.name)


def read_turns(base: Path) -> tuple[list[TurnRecord], list[str]]:
    """The ``turn_<N>`` folders under ``base`` in turn order, and notes about anything odd in them."""
    turns: list[TurnRecord] = []
    notes: list[str] = []
    if not base.is_dir():
        return turns, notes
    for child in base.iterdir():
        match = TURN_RE.match(child.name)
        if not match or not child.is_dir():
            continue
        nodes = []
        for node_dir in sorted((p for p in child.iterdir() if p.is_dir()), key=_sort_key):
            m = NODE_RE.match(node_dir.name)
            if m:
                nodes.append(NodeRecord(node_dir, int(m.group(1)), m.group(2)))
            else:
                # Before node folders carried their YAML position the folder was the bare node name.
                nodes.append(NodeRecord(node_dir, None, node_dir.name))
        turns.append(TurnRecord(int(match.group(1)), child, nodes))
    turns.sort(key=lambda t: t.number)
    if any(len(t.path.name) != len("turn_000") for t in turns):
        notes.append(f"{base.name}: turn folders are not numbered turn_NNN (an older layout); read anyway")
    return turns, notes
