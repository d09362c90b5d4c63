"""The tools config, checked and normalised: ``load_settings(cfg) -> PoolSettings``.

Every problem with a server entry is a ``ToolConfigError`` naming the setting (one line, exit 2 when found by
``prepare()``): no ``command`` and no ``url``, both, unknown keys (however they were added: a ``+key=`` Hydra
override lands in an untyped dict), a bad scope or transport, ``${workspace}`` in a server that lives for the
whole run.

``${workspace}`` in ``args``, ``env`` and ``cwd`` is the task's folder, substituted when the server starts
(``ServerSpec.for_workspace``); the loader keeps the strings that hold it unresolved
(``flowllm.config.plain.plain_config``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from flowllm.config.plain import WORKSPACE_TOKEN
from flowllm.config.schema import SamplingMode, ToolsConfig, ToolServerConfig
from flowllm.core.registry import Registry
from flowllm.errors import ToolConfigError

_PYTHON_COMMANDS = {"python", "python3", "${python}"}
_SERVER_KEYS = frozenset(f.name for f in dataclasses.fields(ToolServerConfig))
_TOOLS_KEYS = frozenset(f.name for f in dataclasses.fields(ToolsConfig))


class Scope(StrEnum):
    TASK = "task"  # a process (or connection) per task: the server may keep state in its workspace
    RUN = "run"  # one connection for the whole run: servers that keep no per-task state


class Transport(StrEnum):
    STDIO = "stdio"
    STREAMABLE_HTTP = "streamable_http"
    SSE = "sse"  # the legacy HTTP transport


@dataclass(frozen=True)
class ServerSpec:
    """One server entry of a ``conf/tools/*.yaml`` file, normalised."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0
    blacklist: frozenset[str] = frozenset()
    requires_env: tuple[str, ...] = ()
    url: str = ""
    transport: Transport = Transport.STDIO
    headers: Mapping[str, str] = field(default_factory=dict)  # header -> environment variable
    cwd: str | None = None
    scope: Scope = Scope.TASK
    retry_on_crash: bool = False

    @property
    def remote(self) -> bool:
        return self.transport is not Transport.STDIO

    @property
    def uses_our_python(self) -> bool:
        return self.command in _PYTHON_COMMANDS

    @property
    def uses_workspace(self) -> bool:
        values = (*self.args, *self.env.values(), self.cwd or "")
        return any(WORKSPACE_TOKEN in v for v in values)

    def executable(self) -> str:
        # 'python' means the interpreter running flowllm, so a virtualenv's packages are there for the server.
        return sys.executable if self.uses_our_python else self.command

    def missing_env(self, environ: Mapping[str, str] | None = None) -> list[str]:
        environ = os.environ if environ is None else environ
        wanted = [*self.requires_env, *(v for v in self.headers.values() if v not in self.requires_env)]
        return [var for var in wanted if not environ.get(var)]

    def for_workspace(self, workspace: Path) -> ServerSpec:
        """This entry with ``${workspace}`` replaced by the task's folder."""
        where = str(workspace)
        return dataclasses.replace(
            self,
            args=tuple(a.replace(WORKSPACE_TOKEN, where) for a in self.args),
            env={k: v.replace(WORKSPACE_TOKEN, where) for k, v in self.env.items()},
            cwd=self.cwd.replace(WORKSPACE_TOKEN, where) if self.cwd else None,
        )

    def header_values(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        environ = os.environ if environ is None else environ
        return {header: environ.get(var, "") for header, var in self.headers.items()}


@dataclass(frozen=True)
class PoolSettings:
    servers: tuple[ServerSpec, ...]
    call_timeout_s: float = 60.0
    max_result_chars: int = 20000
    instructions_max_chars: int = 2000
    sampling: SamplingMode = SamplingMode.decline  # servers' sampling requests: declined, or answered per task


def with_environment(
    settings: PoolSettings, env: Mapping[str, str], only: Mapping[str, Mapping[str, str]] | None = None
) -> PoolSettings:
    """``settings`` with ``env`` added to every local server's environment and ``only[name]`` to that server's
    alone (a remote server runs elsewhere: it takes headers, never an environment)."""
    only = only or {}
    servers = tuple(
        spec if spec.remote else dataclasses.replace(spec, env={**spec.env, **env, **only.get(spec.name, {})})
        for spec in settings.servers
    )
    return dataclasses.replace(settings, servers=servers)


def _plain(node: Any) -> Any:
    """A dataclass or a mapping as plain containers (the loader turns a composed config into one:
    ``flowllm.config.plain.plain_config``)."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        node = dataclasses.asdict(node)
    if isinstance(node, Mapping):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_plain(v) for v in node]
    return node


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ToolConfigError(f"{where} must be a list, not {value!r}")
    return tuple(str(v) for v in value)


def _mapping(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ToolConfigError(f"{where} must be a mapping, not {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def _choice(enum: type[StrEnum], value: Any, where: str) -> Any:
    return Registry.of_enum(where, enum, error=ToolConfigError).require(str(value))


def _number(value: Any, where: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ToolConfigError(f"{where} must be a number, not {value!r}") from None


def _server(name: str, entry: Any, default_scope: Scope) -> ServerSpec:
    where = f"tools.servers.{name}"
    if not isinstance(entry, Mapping):
        raise ToolConfigError(f"{where} must be a mapping with a 'command' or a 'url', not {entry!r}")
    unknown = sorted(set(entry) - _SERVER_KEYS)
    if unknown:
        import difflib

        hints = [difflib.get_close_matches(str(k), _SERVER_KEYS, n=1) for k in unknown]
        hint = "; ".join(f"did you mean '{h[0]}'?" for h in hints if h)
        raise ToolConfigError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}"
            + (f" ({hint})" if hint else f"; known keys: {', '.join(sorted(_SERVER_KEYS))}")
        )
    command = str(entry.get("command") or "").strip()
    url = str(entry.get("url") or "").strip()
    if bool(command) == bool(url):
        raise ToolConfigError(
            f"{where}: give either a 'command' (a local server over stdio) or a 'url' (a remote server)"
            + (", not both" if command else "; the command is empty")
        )
    if entry.get("transport"):
        transport = _choice(Transport, entry["transport"], f"{where}.transport")
    else:
        transport = Transport.STDIO if command else Transport.STREAMABLE_HTTP
    if (transport is Transport.STDIO) != bool(command):
        raise ToolConfigError(f"{where}.transport: '{transport}' needs a {'command' if command else 'url'}")
    if url and not url.startswith(("http://", "https://")):
        raise ToolConfigError(f"{where}.url must start with http:// or https://, not '{url}'")
    scope = _choice(Scope, entry["scope"], f"{where}.scope") if entry.get("scope") else default_scope
    if transport is not Transport.STDIO and not entry.get("scope"):
        scope = Scope.RUN  # a remote server holds no task folder: one connection serves every task
    spec = ServerSpec(
        name=name,
        command=command,
        url=url,
        transport=transport,
        args=_strings(entry.get("args"), f"{where}.args"),
        env=_mapping(entry.get("env"), f"{where}.env"),
        headers=_mapping(entry.get("headers"), f"{where}.headers"),
        cwd=str(entry["cwd"]) if entry.get("cwd") else None,
        timeout_s=_number(entry.get("timeout_s", 60.0), f"{where}.timeout_s"),
        blacklist=frozenset(_strings(entry.get("blacklist"), f"{where}.blacklist")),
        requires_env=_strings(entry.get("requires_env"), f"{where}.requires_env"),
        scope=scope,
        retry_on_crash=bool(entry.get("retry_on_crash", False)),
    )
    if spec.remote and (spec.args or spec.env or spec.cwd):
        raise ToolConfigError(f"{where}: args, env and cwd are for local servers; a 'url' server takes headers")
    if spec.scope is Scope.RUN and spec.uses_workspace:
        raise ToolConfigError(
            f"{where}: ${{workspace}} is the task's folder, but scope=run starts the server once for all tasks; "
            "use scope: task"
        )
    return spec


def load_settings(cfg: PoolSettings | ToolsConfig | Mapping[str, Any]) -> PoolSettings:
    """Check and normalise a ``ToolsConfig`` (dataclass or plain mapping); raises ToolConfigError. Settings
    already loaded are returned as they are."""
    if isinstance(cfg, PoolSettings):
        return cfg
    data = _plain(cfg)
    if not isinstance(data, Mapping):
        raise ToolConfigError(f"tools config must be a mapping, got {type(cfg).__name__}")
    unknown = sorted(set(data) - _TOOLS_KEYS)
    if unknown:
        raise ToolConfigError(f"tools: unknown key(s) {', '.join(map(str, unknown))}")
    scope = _choice(Scope, data.get("scope") or "task", "tools.scope")
    servers = data.get("servers") or {}
    if not isinstance(servers, Mapping):
        raise ToolConfigError("tools.servers must be a mapping of server name -> entry")
    return PoolSettings(
        servers=tuple(_server(str(name), entry, scope) for name, entry in servers.items()),
        call_timeout_s=_number(data.get("call_timeout_s", 60.0), "tools.call_timeout_s"),
        max_result_chars=int(_number(data.get("max_result_chars", 20000), "tools.max_result_chars")),
        instructions_max_chars=int(_number(data.get("instructions_max_chars", 2000), "tools.instructions_max_chars")),
        sampling=_choice(SamplingMode, data.get("sampling") or SamplingMode.decline, "tools.sampling"),
    )
