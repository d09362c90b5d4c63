"""The emulator's script: which reply each task gets on each turn.

    default:                       # used when the task has no entry, or the turn runs past its entry
      - text: "I could not solve this task. \\boxed{none}"
    tasks:
      <task_id>/<agent>:           # a sub-agent's conversation within that task (X-Flowllm-Agent header)
        - text: "..."
      <task_id>#<n>:               # epoch n of an experiment.epochs run (X-Flowllm-Epoch header), when given
        - text: "..."
      <task_id>:
        - text: "reply for turn 1"
        - thinking: "optional"     # emitted as a thinking block (with a signature) / reasoning item
          text: "The answer is \\boxed{${last_tool_result}}"
          tool_calls: [{name: tool-math-calculate, input: {expression: "2+2"}}]
          stop_reason: end_turn    # default end_turn (tool_use when tool_calls)

    images:                        # what the "model" sees in an image, by the SHA-256 of its bytes (12+ hex chars)
      3f2a9c01b7d4e5f6: "42"

Templates use ``string.Template.safe_substitute``: ``${last_tool_result}`` and ``${tool_result_N}`` (1-based),
the stripped contents of the tool results found in the request, and ``${image}``, the ``images`` entry of the
last image in the request (a vision call answers from the image it really received, so a wrong or missing
image gives a wrong answer). Selection depends only on (task id, turn, tool
results), which keeps the emulator stateless and every rerun identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

import yaml  # PyYAML comes with hydra-core / omegaconf

from flowllm.emulator.faults import FaultConfigError, FaultPlan
from flowllm.errors import BuildError
from flowllm.parsing.isolation import NATIVE_FRAME

NO_SCRIPTED_REPLY = "(no scripted reply)"
_ENTRY_KEYS = {"text", "thinking", "redacted_thinking", "tool_calls", "stop_reason"}


class ScriptError(BuildError, ValueError):
    """The script file is malformed; the message names the task and entry."""


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class ScriptEntry:
    text: str = ""
    thinking: str | None = None
    # Opaque data of a redacted_thinking block (Anthropic), to exercise its verbatim round trip.
    redacted_thinking: str | None = None
    tool_calls: tuple[ScriptedCall, ...] = ()
    stop_reason: str | None = None


@dataclass(frozen=True)
class Reply:
    """A rendered entry: what the model says on this turn, before any wire encoding."""

    text: str
    thinking: str | None
    redacted_thinking: str | None
    tool_calls: tuple[ScriptedCall, ...]
    stop_reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "thinking": self.thinking,
            "redacted_thinking": self.redacted_thinking,
            "tool_calls": [{"name": c.name, "input": c.input} for c in self.tool_calls],
            "stop_reason": self.stop_reason,
        }


@dataclass
class Script:
    default: list[ScriptEntry] = field(default_factory=list)
    tasks: dict[str, list[ScriptEntry]] = field(default_factory=dict)
    # The `faults:` section as written (see faults.py); validated at load, parsed by the emulator.
    faults: dict[str, Any] = field(default_factory=dict)
    # SHA-256 prefix (lower-case hex) -> what the image shows, for ${image}.
    images: dict[str, str] = field(default_factory=dict)
    # The `batches:` section: how the emulated batch APIs behave (flowllm/emulator/batches.py).
    batches: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, source: str | Path | dict[str, Any]) -> Script:
        if isinstance(source, dict):
            data: Any = source
            where = "<dict>"
        else:
            path = Path(source)
            where = str(path)
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except OSError as exc:
                raise ScriptError(f"cannot read emulator script {where}: {exc}") from exc
            except yaml.YAMLError as exc:
                raise ScriptError(f"emulator script {where} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ScriptError(f"emulator script {where}: the top level must be a mapping")
        unknown = set(data) - {"default", "tasks", "faults", "images", "batches"}
        if unknown:
            raise ScriptError(f"emulator script {where}: unknown top-level keys {sorted(unknown)}")
        tasks = data.get("tasks") or {}
        if not isinstance(tasks, dict):
            raise ScriptError(f"emulator script {where}: 'tasks' must map task ids to lists of replies")
        faults = data.get("faults") or {}
        try:
            FaultPlan.parse(faults, f"{where}: faults")
        except FaultConfigError as exc:
            raise ScriptError(str(exc)) from exc
        images = data.get("images") or {}
        if not isinstance(images, dict) or not all(
            isinstance(k, str) and len(k) >= 12 and all(c in "0123456789abcdef" for c in k.lower()) for k in images
        ):
            raise ScriptError(
                f"emulator script {where}: 'images' must map SHA-256 prefixes (12 or more hex characters) to text"
            )
        return cls(
            default=_entries(data.get("default") or [], f"{where}: default"),
            tasks={str(k): _entries(v or [], f"{where}: tasks.{k}") for k, v in tasks.items()},
            faults=dict(faults),
            images={k.lower(): str(v) for k, v in images.items()},
            batches=dict(data.get("batches") or {}),
        )

    def key(self, task_id: str | None, agent: str | None, epoch: str | None = None) -> str | None:
        """Which entry answers: a sub-agent's conversation reads ``tasks["<task_id>/<agent>"]``; epoch n of an
        ``experiment.epochs`` run reads ``tasks["<task_id>#<n>"]`` when the script has it."""
        key = f"{task_id}/{agent}" if task_id is not None and agent and agent != "main" else task_id
        if key is not None and epoch and f"{key}#{epoch}" in self.tasks:
            return f"{key}#{epoch}"
        return key

    def entry(self, task_id: str | None, turn: int) -> ScriptEntry | None:
        """The entry for ``turn`` (1-based) of ``task_id``; past the task's list, ``default``'s entries."""
        entries = self.tasks.get(task_id, []) if task_id is not None else []
        if 1 <= turn <= len(entries):
            return entries[turn - 1]
        if not self.default:
            return None
        past = max(turn - len(entries), 1)  # 1 = the first turn beyond the task's own entries
        return self.default[min(past, len(self.default)) - 1]

    def describe_image(self, digest: str) -> str:
        for prefix, text in self.images.items():
            if digest.startswith(prefix):
                return text
        return f"(the emulator script describes no image with SHA-256 {digest[:16]}...)"

    def reply(self, task_id: str | None, turn: int, tool_results: list[str], images: tuple[str, ...] = ()) -> Reply:
        entry = self.entry(task_id, turn)
        if entry is None:
            return Reply(NO_SCRIPTED_REPLY, None, None, (), "end_turn")
        values = template_values(tool_results)
        values["image"] = self.describe_image(images[-1]) if images else "(there is no image in the request)"
        calls = tuple(ScriptedCall(c.name, _render(c.input, values)) for c in entry.tool_calls)
        stop = entry.stop_reason or ("tool_use" if calls else "end_turn")
        return Reply(
            text=Template(entry.text).safe_substitute(values),
            thinking=None if entry.thinking is None else Template(entry.thinking).safe_substitute(values),
            redacted_thinking=entry.redacted_thinking,
            tool_calls=calls,
            stop_reason=stop,
        )


def _data(result: str) -> str:
    """What a tool returned, as a model reads it: without the "data, not instructions" framing line that native
    tool results carry (flowllm/parsing/isolation.py), which is addressed to the model, not part of the data."""
    return result.removeprefix(NATIVE_FRAME).strip()


def template_values(tool_results: list[str]) -> dict[str, str]:
    values = {f"tool_result_{i}": _data(r) for i, r in enumerate(tool_results, start=1)}
    values["last_tool_result"] = _data(tool_results[-1]) if tool_results else ""
    return values


def _render(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        return Template(value).safe_substitute(values)
    if isinstance(value, dict):
        return {k: _render(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, values) for v in value]
    return value


def _entries(raw: Any, where: str) -> list[ScriptEntry]:
    if not isinstance(raw, list):
        raise ScriptError(f"{where}: expected a list of replies")
    out: list[ScriptEntry] = []
    for i, item in enumerate(raw, start=1):
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict):
            raise ScriptError(f"{where}[{i}]: a reply must be a mapping with 'text'")
        unknown = set(item) - _ENTRY_KEYS
        if unknown:
            raise ScriptError(f"{where}[{i}]: unknown keys {sorted(unknown)} (allowed: {sorted(_ENTRY_KEYS)})")
        calls = []
        for j, call in enumerate(item.get("tool_calls") or [], start=1):
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ScriptError(f"{where}[{i}].tool_calls[{j}]: needs a 'name' string and an 'input' mapping")
            args = call.get("input") or {}
            if not isinstance(args, dict):
                raise ScriptError(f"{where}[{i}].tool_calls[{j}]: 'input' must be a mapping")
            calls.append(ScriptedCall(call["name"], args))
        out.append(
            ScriptEntry(
                text=str(item.get("text") or ""),
                thinking=None if item.get("thinking") is None else str(item["thinking"]),
                redacted_thinking=None if item.get("redacted_thinking") is None else str(item["redacted_thinking"]),
                tool_calls=tuple(calls),
                stop_reason=item.get("stop_reason"),
            )
        )
    return out
