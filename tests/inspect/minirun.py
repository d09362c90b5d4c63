"""Small run directories written by hand, for inspect tests that need exact contents (no flowllm run needed).

The layout is the one the recorder writes: ``summary.json``, ``tasks/<id>/result.json`` and
``tasks/<id>/turn_NNN/NN_<node>/{input,output,meta}.json``.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# One node of a turn: (name, input, output); None leaves that file out.
Node = tuple[str, Any, Any]


def _write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2), encoding="utf-8")


def write_task(run: Path, task_id: str, turns: Sequence[Sequence[Node]], **result: Any) -> Path:
    task = run / "tasks" / task_id
    _write(
        task / "result.json",
        {
            "task_id": task_id,
            "status": "completed",
            "answer": "42",
            "ground_truth": "42",
            "correct": True,
            "turns": len(turns),
            "error": None,
            "level": 1,
            **result,
        },
    )
    for number, nodes in enumerate(turns, start=1):
        for index, (name, node_input, node_output) in enumerate(nodes, start=1):
            folder = task / f"turn_{number:03d}" / f"{index:02d}_{name}"
            meta = {"node": name, "turn": number, "started_at": None, "duration_s": 0.01, "status": "ok"}
            _write(folder / "meta.json", meta)
            if node_input is not None:
                _write(folder / "input.json", node_input)
            if node_output is not None:
                _write(folder / "output.json", node_output)
    return task


def write_run(run: Path, summary: dict[str, Any] | None = None) -> Path:
    """The run's summary.json (the figures a one-task run would have, updated with ``summary``)."""
    _write(
        run / "summary.json",
        {
            "tasks": 1,
            "finished": 1,
            "completed": 1,
            "failed": 0,
            "correct": 1,
            "accuracy": 1.0,
            "turns": 1,
            "tool_calls": 0,
            "bad_tool_calls": 0,
            "failed_tool_calls": 0,
            "parse_rate": None,
            "repairs": {},
            "usage": {"input_tokens": 10, "output_tokens": 2},
            "wall_seconds": 1.0,
            **(summary or {}),
        },
    )
    (run / "tasks").mkdir(parents=True, exist_ok=True)
    return run


def png(width: int, height: int, rgb: tuple[int, int, int] = (30, 90, 200)) -> bytes:
    """A valid PNG of one colour (browsers decode it), made without an imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
