"""State across turns for tools that need it: a per-task key-value store, persisted in the task folder.

Some tools are conversations of their own: a form filled field by field, a shopping cart, a multi-step
wizard. Their server could keep state in memory, but a server may be restarted mid-task (the pool does so
after a crash or a hang) and a task may run its servers lazily or share them across tasks (``tools.scope=run``).
So the state belongs to the task, not to the process:

* ``TaskState`` is the store: one namespace per tool server, JSON values, written atomically to
  ``tasks/<id>/state.json`` after every change (readable with the run's other records).
* A tool **asks** for it by declaring ``_meta: {"flowllm/state": true}`` in its MCP tool definition
  (``asks_for_state()``). Only then does the pool send the server's namespace with the call, in the request's
  ``_meta["flowllm/state"]``; the tool answers with the changes in its result's ``_meta["flowllm/state"]``
  (``{"set": {...}, "delete": [...]}``, built by ``state_result``), which the pool applies. Tools that do not
  ask see nothing; changes are applied per key, so concurrent calls of one task do not overwrite each other.
* ``dispatch_tools`` hands the store to the tool backend when ``tools.task_state=true`` (off by default).

``python -m flowllm.tools.state`` runs ``tool-form``, a small stateful server (set_field, get_form,
submit_form) that shows the protocol and serves the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer

from flowllm.rundir.layout import STATE_FILE

STATE_META_KEY = "flowllm/state"


class TaskState:
    """A task's key-value store: ``namespace -> {key: JSON value}``, saved to ``path`` on every change."""

    def __init__(self, path: Path | str, *, fresh: bool = False) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, Any]] = {}
        if fresh:
            self.path.unlink(missing_ok=True)  # a new attempt at a task starts from nothing
        elif self.path.is_file():
            loaded = json.loads(self.path.read_text(encoding="utf-8") or "{}")
            if not isinstance(loaded, dict):
                raise ValueError(f"{self.path}: a task state file must hold a JSON object")
            self._data = {str(ns): dict(values) for ns, values in loaded.items()}

    @classmethod
    def for_workspace(cls, workspace: Path | str, *, fresh: bool = False) -> TaskState:
        """The store of the task whose working folder is ``workspace`` (``tasks/<id>/workspace``)."""
        return cls(Path(workspace).parent / STATE_FILE, fresh=fresh)

    def values(self, namespace: str) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self._data.get(namespace, {})))  # a copy the caller cannot mutate

    def get(self, namespace: str, key: str, default: Any = None) -> Any:
        return self.values(namespace).get(key, default)

    def set(self, namespace: str, key: str, value: Any) -> None:
        self.apply(namespace, {"set": {key: value}})

    def delete(self, namespace: str, key: str) -> None:
        self.apply(namespace, {"delete": [key]})

    def apply(self, namespace: str, update: Mapping[str, Any]) -> None:
        """Apply ``{"set": {key: value}, "delete": [key], "clear": bool}`` and save."""
        sets = update.get("set") or {}
        deletes = update.get("delete") or []
        if not isinstance(sets, Mapping) or not isinstance(deletes, list):
            raise ValueError("a state update is {'set': {key: value}, 'delete': [key], 'clear': bool}")
        encoded = json.loads(json.dumps(dict(sets)))  # values must be JSON: fail here, not when saving
        with self._lock:
            space = {} if update.get("clear") else dict(self._data.get(namespace, {}))
            space.update(encoded)
            for key in deletes:
                space.pop(str(key), None)
            if space:
                self._data[namespace] = space
            else:
                self._data.pop(namespace, None)
            self._save()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return json.loads(json.dumps(self._data))

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(self._data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


# ------------------------------------------------------------------------------------- the MCP side


def asks_for_state() -> dict[str, Any]:
    """The tool ``meta`` a server declares to receive its task state (``server.add_tool(..., meta=...)``)."""
    return {STATE_META_KEY: True}


def tool_asks_for_state(tool: Any) -> bool:
    meta = getattr(tool, "meta", None) or {}
    return bool(isinstance(meta, Mapping) and meta.get(STATE_META_KEY))


def request_state(ctx: Context) -> dict[str, Any]:
    """Server side: the state the client sent with this call (an MCPServer tool's ``Context``)."""
    meta = getattr(ctx.request_context, "meta", None) or {}
    values = meta.get(STATE_META_KEY) if isinstance(meta, Mapping) else None
    return dict(values) if isinstance(values, Mapping) else {}


def state_result(
    text: str, *, set: Mapping[str, Any] | None = None, delete: list[str] | None = None, is_error: bool = False
) -> types.CallToolResult:
    """Server side: a tool result carrying state changes for the client to apply."""
    update: dict[str, Any] = {}
    if set:
        update["set"] = dict(set)
    if delete:
        update["delete"] = list(delete)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        is_error=is_error,
        _meta={STATE_META_KEY: update} if update else None,
    )


def result_state_update(result: Any) -> dict[str, Any] | None:
    """Client side: the state changes a tool result carries, if any."""
    meta = getattr(result, "meta", None) or {}
    update = meta.get(STATE_META_KEY) if isinstance(meta, Mapping) else None
    return dict(update) if isinstance(update, Mapping) else None


# ------------------------------------------------------------------------------- tool-form, an example

FORM_SERVER_NAME = "tool-form"


def build_form_server(fields: list[str] | None = None) -> MCPServer:
    """``tool-form``: fill a form one field per call; the filled fields live in the task state."""
    required = list(fields or ["name", "email", "topic"])
    server = MCPServer(FORM_SERVER_NAME, instructions="A form filled one field at a time.", log_level="WARNING")

    def set_field(field: str, value: str, ctx: Context) -> types.CallToolResult:
        if field not in required:
            return state_result(f"unknown field '{field}'; the form has: {', '.join(required)}", is_error=True)
        filled = {**request_state(ctx), field: value}
        missing = [f for f in required if f not in filled]
        note = f"still missing: {', '.join(missing)}" if missing else "every field is filled; submit the form"
        return state_result(f"{field} = {value!r}; {note}", set={field: value})

    def get_form(ctx: Context) -> types.CallToolResult:
        filled = request_state(ctx)
        lines = [f"{f}: {filled.get(f, '(empty)')}" for f in required]
        return state_result("\n".join(lines))

    def submit_form(ctx: Context) -> types.CallToolResult:
        filled = request_state(ctx)
        missing = [f for f in required if f not in filled]
        if missing:
            return state_result(f"cannot submit: missing {', '.join(missing)}", is_error=True)
        summary = "; ".join(f"{f}={filled[f]}" for f in required)
        return state_result(f"submitted: {summary}", set={"_submitted": True})

    for fn, text in (
        (set_field, "Set one field of the form (fields: " + ", ".join(required) + ")."),
        (get_form, "Show the form with the fields filled so far."),
        (submit_form, "Submit the form once every field is filled."),
    ):
        server.add_tool(fn, name=fn.__name__, description=text, meta=asks_for_state(), structured_output=False)
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flowllm.tools.state", description="Run the tool-form server.")
    parser.add_argument("--fields", default="name,email,topic", help="comma-separated form fields")
    args = parser.parse_args(argv)
    build_form_server([f.strip() for f in args.fields.split(",") if f.strip()]).run()


if __name__ == "__main__":
    main()
