"""Every error flowllm raises on purpose, in one tree.

    FlowError                      reported to the user as one line, no traceback; the message says what to do
    ├── BuildError                 found before the first task: the run does not start (exit code 2)
    │   ├── ConfigError            a setting is invalid (names the setting)
    │   ├── PipelineError          the turn graph cannot be built or cannot serve the agent (engine/errors.py)
    │   ├── DatasetError           the dataset is missing or malformed (datasets/)
    │   ├── ProviderConfigError    a provider cannot work as configured (providers/errors.py)
    │   ├── ToolConfigError        a tool server entry is invalid (tools/)
    │   ├── ScriptError            an emulator script is invalid (emulator/script.py)
    │   └── PricingError           the price table is malformed (experiment/pricing.py)
    └── RunError                   raised while tasks run; the task fails, the run goes on
        ├── NodeExecutionError     a node raised (engine/errors.py)
        ├── ProviderError          a model call failed (providers/errors.py: ProviderCallError and kin)
        └── ToolError              a tool server failed in a way the model cannot be told about

``ErrorKind`` names why a model call failed. It is a ``StrEnum``: the retry policy's ``retry_on`` list, the
breaker, the ledger and ``meta.json`` all spell kinds as these strings.
"""

from __future__ import annotations

from enum import StrEnum


class FlowError(Exception):
    """Base of every error flowllm reports to a user as one line (no traceback)."""


class BuildError(FlowError):
    """Found before the first task: the run does not start."""


class RunError(FlowError):
    """Raised while tasks run: the task that met it fails, the others go on."""


class ConfigError(BuildError, ValueError):
    """A setting is invalid; the message names it and says what to write instead."""


class ToolConfigError(ConfigError):
    """A tool server entry cannot work (no command or url, unknown keys, a bad scope)."""


class ToolError(RunError):
    """A tool server failed in a way that is not the model's to handle."""


class ErrorKind(StrEnum):
    """Why one model call failed, in words a retry policy can act on."""

    # Transient by nature: worth another try.
    OVERLOADED = "overloaded"
    RATE_LIMIT = "rate_limit"
    SERVER = "server"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    CONFLICT = "conflict"
    TRUNCATED = "truncated"  # a stream that stopped before its final event
    # The reply arrived broken: asking again usually works, but only when the policy says so.
    BAD_RESPONSE = "bad_response"
    EMPTY_REPLY = "empty_reply"
    STREAM_ERROR = "stream_error"
    # The request's fault, or the account's: the same request fails the same way again.
    BAD_REQUEST = "bad_request"
    CONTEXT_LENGTH = "context_length"
    AUTH = "auth"
    PERMISSION = "permission"
    NOT_FOUND = "not_found"
    QUOTA = "quota"

    @property
    def transient(self) -> bool:
        return self in _TRANSIENT

    @property
    def never_retried(self) -> bool:
        return self in _NEVER_RETRIED


_TRANSIENT = frozenset(
    {
        ErrorKind.OVERLOADED,
        ErrorKind.RATE_LIMIT,
        ErrorKind.SERVER,
        ErrorKind.TIMEOUT,
        ErrorKind.CONNECTION,
        ErrorKind.CONFLICT,
        ErrorKind.TRUNCATED,
    }
)
_NEVER_RETRIED = frozenset(
    {
        ErrorKind.BAD_REQUEST,
        ErrorKind.CONTEXT_LENGTH,
        ErrorKind.AUTH,
        ErrorKind.PERMISSION,
        ErrorKind.NOT_FOUND,
        ErrorKind.QUOTA,
    }
)

__all__ = [
    "BuildError",
    "ConfigError",
    "ErrorKind",
    "FlowError",
    "RunError",
    "ToolConfigError",
    "ToolError",
]
