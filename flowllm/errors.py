"""Every error flowllm raises on purpose, in one tree; every class of it is drawn here.

    FlowError                          reported to the user as one line, no traceback; the message says what to do
    ├── BuildError                     found before the first task: nothing runs (exit code 2)
    │   ├── ConfigError                a setting is invalid (names the setting)
    │   │   ├── ToolConfigError        a tool server entry is invalid (tools/)
    │   │   └── FingerprintMismatch    a rerun's settings differ from what produced the folder's results
    │   │                              (setup/fingerprint.py)
    │   ├── PipelineError              the turn graph cannot be built or cannot serve the agent (engine/errors.py)
    │   │   ├── UnknownTargetError     a node's _target_ cannot be imported
    │   │   ├── MissingInputError      a node reads what no node produces
    │   │   ├── DuplicateProducerError two nodes produce the same key
    │   │   └── CycleError             the graph has a cycle
    │   ├── DatasetError               the dataset is missing or malformed (datasets/task.py)
    │   ├── ProviderConfigError        a provider cannot work as configured (providers/errors.py)
    │   ├── ScriptError                an emulator script is invalid (emulator/script.py)
    │   ├── PricingError               the price table is malformed (spend/pricing.py)
    │   ├── PluginError                an installed plug-in's entry point cannot be loaded (core/registry.py)
    │   └── PreflightError             every problem the checks before the first task found (setup/preflight.py)
    ├── RunError                       raised while tasks run: the task that meets it fails, the others go on
    │   ├── NodeExecutionError         a node raised (engine/errors.py)
    │   ├── NodeContractError          a node returned other outputs than it declares (engine/errors.py)
    │   ├── PromptIsolationError       a hook found the system prompt outside its place (nodes/hooks.py)
    │   ├── RecordError                a task's records could not be written (engine/recorder.py)
    │   ├── ProviderError              a model call failed (providers/errors.py)
    │   │   ├── ProviderCallError      one call failed, with the kind of failure
    │   │   │   ├── ProviderResponseError   the reply arrived but cannot be used
    │   │   │   └── NoUsableKeyError   every key of the pool is resting or retired (providers/keys.py)
    │   │   └── ReplayMissError        a replay asked for a turn the saved run never made (providers/replay.py)
    │   └── RunStopped                 the run stopped after tasks ran (a worker process failed); what finished is
    │                                  saved and the exit code follows the tasks (3 or 4, exit_codes.py)
    └── CliError                       a command that reads saved runs (flowllm inspect, export) cannot do what it
        │                              was asked; carries its exit code (2: bad input, nothing was done)
        ├── UsageError                 bad arguments, or a folder that is not a run (inspect/commands/common.py)
        ├── NotFound                   a task, turn or node the run does not have (inspect/commands/common.py)
        ├── NotARunError               the folder is not a flowllm run or multirun (inspect/artifacts.py)
        ├── NoCommonTasks              two runs with no scored task in common: nothing to pair (inspect/paired.py)
        ├── UsageInputError            a path holding no usage ledger, or a bad --by (inspect/usage.py)
        ├── PowerUsageError            bad arguments, or a run without the figures asked for (inspect/power.py)
        ├── ExportError                nothing can be exported: not a run, a missing extra, an unwritable file
        │                              (export/source.py)
        ├── VerifyInputError           flowllm verify was given no run, or a file of it does not parse
        │                              (verify/evidence.py)
        ├── BundleInputError           flowllm bundle or verify FILE was given no run or no bundle (truncated,
        │                              newer), or a dataset that differs (bundle/manifest.py)
        ├── NoRun                      inspect scale/bisect was given a path with no run (analysis/epoch_runs.py)
        ├── NoCommonTask               the runs given to inspect scale have no scored task in common
        │                              (analysis/scale_report.py)
        ├── KTooLarge                  inspect scale --k is more than the epochs run (analysis/scale_report.py)
        ├── JudgeUnavailable           inspect scale --judge names no provider that can be opened (analysis/rerank.py)
        ├── OverBudget                 inspect bisect's forks would cost more than --max-cost (analysis/bisect_run.py)
        ├── ForkFailed                 one of inspect bisect's forks ended with an error (analysis/bisect_run.py)
        └── RecordFormatError          a run file (summary, result, ledger line) is not a JSON object
                                       (rundir/record_base.py)

A build error exits 2 ("nothing ran"); a run error that reaches the app after tasks ran exits with the code of
the run's tasks; a ``CliError`` exits with the code it carries. Where a library catches every ``Exception``
(Hydra's callbacks warn and go on), an error of the tree is raised inside a ``CarriedError`` (a ``BaseException``
that is no error of its own), which the command line unwraps. A tool's failure is not in this tree: a tool
server answers the model with an MCP error (``mcp``'s own ``ToolError``), and a server that cannot start is a
preflight problem.

``ErrorKind`` names why a model call failed. It is a ``StrEnum``: the retry policy's ``retry_on`` list, the
breaker, the ledger and ``meta.json`` all spell kinds as these strings. ``DEFAULT_RETRY_ON`` (the kinds a
transient failure or a reply that arrived broken has) is the default ``retry_on`` and what the breaker counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class FlowError(Exception):
    """Base of every error flowllm reports to a user as one line (no traceback)."""


class BuildError(FlowError):
    """Found before the first task: the run does not start."""


class RunError(FlowError):
    """Raised while tasks run: the task that met it fails, the others go on."""


class CliError(FlowError):
    """A command that reads saved runs cannot do what it was asked (one line); ``exit_code`` is what it exits with
    (2: bad input, such as a folder that is not a run or a task it does not have; nothing was done)."""

    exit_code: int = 2


class CarriedError(BaseException):
    """Carries ``error`` past code that catches every ``Exception``; ``flowllm.cli.run`` says it and exits with its
    code, as if it had been raised there."""

    def __init__(self, error: FlowError) -> None:
        super().__init__(str(error))
        self.error = error


class ConfigError(BuildError, ValueError):
    """A setting is invalid; the message names it and says what to write instead."""


class ToolConfigError(ConfigError):
    """A tool server entry cannot work (no command or url, unknown keys, a bad scope)."""


class FingerprintMismatch(ConfigError):
    """A rerun into a run directory whose results other settings produced (``experiment.resume=force`` proceeds)."""


class PluginError(BuildError):
    """An installed package's entry point (``flowllm.scorers``...) failed to load or is not what its group takes;
    the message names the entry point and its distribution."""


class RunStopped(RunError):
    """The run stopped after tasks ran; ``summary`` is what it wrote (its tasks decide the exit code)."""

    def __init__(self, message: str, summary: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.summary = summary


class ErrorKind(StrEnum):
    """Why one model call failed, in words a retry policy can act on."""

    # (The order of the members is the order of DEFAULT_RETRY_ON, as saved configs list it.)
    # Transient by nature: worth another try.
    CONNECTION = "connection"
    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    OVERLOADED = "overloaded"
    SERVER = "server"
    CONFLICT = "conflict"
    TRUNCATED = "truncated"  # a stream that stopped before its final event
    # The reply arrived broken: asking again usually works (the default retry_on lists these too).
    STREAM_ERROR = "stream_error"
    BAD_RESPONSE = "bad_response"
    EMPTY_REPLY = "empty_reply"
    # A server that parses its model's reply in the family's own format (llama.cpp) could not: the same request
    # samples the same reply at temperature 0, so it is retried only when retry_on names it.
    UNPARSED_REPLY = "unparsed_reply"
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

    @property
    def retried_by_default(self) -> bool:
        """Transient, or a reply that arrived broken: the default ``retry_on``, and a sign the provider is unwell."""
        return self in _TRANSIENT or self in _BROKEN_REPLY


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
_BROKEN_REPLY = frozenset({ErrorKind.STREAM_ERROR, ErrorKind.BAD_RESPONSE, ErrorKind.EMPTY_REPLY})
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

# The default ``provider.retry.retry_on`` (config/schema.py) and the failures the breaker counts (providers/breaker.py).
DEFAULT_RETRY_ON: tuple[ErrorKind, ...] = tuple(k for k in ErrorKind if k.retried_by_default)

__all__ = [
    "DEFAULT_RETRY_ON",
    "BuildError",
    "CarriedError",
    "CliError",
    "ConfigError",
    "ErrorKind",
    "FingerprintMismatch",
    "FlowError",
    "PluginError",
    "RunError",
    "RunStopped",
    "ToolConfigError",
]
