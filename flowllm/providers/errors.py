"""Errors of the provider layer, and the one place SDK exceptions are classified.

Both SDKs raise their own exception trees; the rest of flowllm only sees two kinds of error:

* ``ProviderConfigError``: the configuration cannot work (unknown protocol, missing key variable). Raised
  before any task starts, by ``check_provider_config``; its message is one line that says what to do.
* ``ProviderCallError``: one call failed. ``kind`` says why in words a retry policy can act on
  (``retryable``, ``retry_after``), ``status`` keeps the HTTP status when there was one.

Classification looks at the error *type* in the body before the status code, because an Anthropic stream can
fail after HTTP 200 (``event: error`` with ``overloaded_error``), which the SDK raises with status 200.
"""

from __future__ import annotations

import re
from typing import Any

from flowllm.core.types import Usage
from flowllm.errors import BuildError, ErrorKind, RunError

# Error types of the Anthropic and OpenAI bodies -> our kinds.
_TYPE_KINDS: dict[str, str] = {
    "overloaded_error": "overloaded",
    "rate_limit_error": "rate_limit",
    "rate_limit_exceeded": "rate_limit",
    "insufficient_quota": "quota",
    "api_error": "server",
    "server_error": "server",
    "internal_server_error": "server",
    "timeout_error": "timeout",
    "invalid_request_error": "bad_request",
    "request_too_large": "bad_request",
    "context_length_exceeded": "context_length",
    "authentication_error": "auth",
    "invalid_api_key": "auth",
    "permission_error": "permission",
    "not_found_error": "not_found",
    "model_not_found": "not_found",
    "billing_error": "quota",
}

_STATUS_KINDS: dict[int, str] = {
    400: "bad_request",
    401: "auth",
    403: "permission",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "bad_request",
    422: "bad_request",
    429: "rate_limit",
    529: "overloaded",
}

# Kinds worth retrying: transient by nature. 400/401/403/404 never are; neither is a
# prompt too long for the model's context (``context_length``): the same request fails the same way again.
# ``truncated`` is a stream that stopped before its final event (a proxy or server cut it).
RETRYABLE_KINDS = frozenset(k for k in ErrorKind if k.transient)
# Kinds that are the request's fault (or the account's): no retry, whatever a policy says.
NEVER_RETRY_KINDS = frozenset(k for k in ErrorKind if k.never_retried)
ALL_KINDS = frozenset(ErrorKind)

# How servers say "the prompt does not fit": Anthropic has no dedicated type (invalid_request_error with this
# message), OpenAI-compatible servers use the code or similar wording.
_CONTEXT_LENGTH_HINTS = (
    "context_length_exceeded",
    "prompt is too long",
    "maximum context length",
    "context length",
    "context window",
    "too many tokens",
)


class ProviderError(RunError):
    """Base of every error raised by ``flowllm.providers``."""


class ProviderConfigError(BuildError, ValueError):
    """The provider configuration cannot work; the message says how to fix it (found before the first task)."""


class ProviderCallError(ProviderError):
    """One model call failed.

    ``kind``: connection | timeout | rate_limit | overloaded | server | conflict | truncated | quota |
    bad_request | context_length | auth | permission | not_found | bad_response | empty_reply | stream_error |
    unparsed_reply.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind | str,
        provider: str = "",
        status: int | None = None,
        retry_after: float | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = ErrorKind(kind)
        self.provider = provider
        self.status = status
        self.retry_after = retry_after
        self.error_type = error_type

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS

    def to_dict(self) -> dict[str, Any]:
        """What the recorder writes into meta.json (never a header or key)."""
        return {
            "error": type(self).__name__,
            "kind": self.kind,
            "message": self.message,
            "provider": self.provider,
            "status": self.status,
            "retryable": self.retryable,
            "retry_after": self.retry_after,
            "error_type": self.error_type,
        }

    def __str__(self) -> str:
        where = f"{self.provider}: " if self.provider else ""
        status = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{where}{self.kind}{status}: {self.message}"


class ProviderResponseError(ProviderCallError):
    """The reply arrived but cannot be used: unparseable, or empty. ``usage``: what the reply says it counted
    (or its estimate) when it could be read that far: the provider billed it all the same."""

    def __init__(self, message: str, *, usage: Usage | None = None, **where: Any) -> None:
        super().__init__(message, **where)
        self.usage = usage


def _body_error(body: Any) -> tuple[str | None, str | None, str | None]:
    """(error type, code, message) from an Anthropic or OpenAI error body, in any of the shapes the SDKs hand
    over."""
    if not isinstance(body, dict):
        return None, None, body if isinstance(body, str) and body else None
    err = body.get("error", body)
    if isinstance(err, dict):
        code = err.get("code")
        etype = err.get("type") or code
        message = err.get("message")
        return (
            (str(etype) if etype else None),
            (str(code) if code else None),
            (str(message) if message else None),
        )
    return None, None, None


# How servers that render a model's own chat template (llama.cpp's llama-server) say, with HTTP 500, that the
# request itself cannot be rendered or read: the template raised, or the history's tool-call arguments did not
# parse. The same request fails the same way again, so it is not retried.
_REQUEST_REJECTED_HINTS = (
    "jinja exception",
    "failed to parse tool call arguments",
    "roles must alternate",
)
# The template engine's own trace: "While executing CallExpression at line 12, column 5 in source: ...",
# "Error executing FilterExpression at position 40: ...".
_TEMPLATE_TRACE = re.compile(r"while executing \w+ at line \d+|error executing \w+ at position \d+")


# How llama.cpp's server says, with HTTP 500, that the model's reply did not follow the family's output format it
# parses (the reply, not the request: "The model produced output that does not match the expected peg-native
# format").
_REPLY_UNPARSED_HINT = "the model produced output that does not match the expected"


def is_reply_unparsed(message: str | None) -> bool:
    """Whether a server error's message says the server could not parse its model's reply in the model
    family's own output format."""
    return _REPLY_UNPARSED_HINT in (message or "").lower()


def is_request_rejected(message: str | None) -> bool:
    """Whether a server error's message says the request could not be rendered or read (not a transient
    failure): a chat-template exception or a parse failure of what the request carried."""
    lowered = (message or "").lower()
    return any(hint in lowered for hint in _REQUEST_REJECTED_HINTS) or bool(_TEMPLATE_TRACE.search(lowered))


def is_context_length(*texts: str | None) -> bool:
    """Whether an error type, code or message says the prompt exceeds the model's context window."""
    return any(hint in text.lower() for text in texts if text for hint in _CONTEXT_LENGTH_HINTS)


def _retry_after(headers: Any) -> float | None:
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return float(ms) / 1000.0
        value = headers.get("retry-after")
        if value is not None:
            return float(value)
    except (TypeError, ValueError):
        return None
    return None


def classify_error_type(error_type: str | None) -> str:
    """Our kind for an error type or code found in a body or a stream event."""
    return _TYPE_KINDS.get(error_type or "", "stream_error")


# Transport exception classes (httpx's tree, whichever package ships it) by what they mean for the user.
_REFUSED = frozenset({"ConnectError", "ConnectTimeout", "ConnectionRefusedError", "gaierror"})
_DROPPED = frozenset({"RemoteProtocolError", "ReadError", "WriteError", "ConnectionResetError", "IncompleteRead"})
_TRANSPORT = frozenset({"TransportError", "NetworkError", "ProtocolError"}) | _REFUSED | _DROPPED


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _root_cause(exc: BaseException) -> BaseException:
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or exc.__context__
        if nxt is None:
            break
        exc = nxt
    return exc


def _endpoint(exc: BaseException, url: str | None) -> str:
    """The URL the failed request went to (the SDK's request object knows it), else the configured base."""
    try:
        request_url = getattr(getattr(exc, "request", None), "url", None)
    except RuntimeError:  # httpx raises when an exception carries no request
        request_url = None
    return str(request_url) if request_url else (url or "the endpoint")


def connection_message(exc: BaseException, *, url: str | None) -> str:
    """What a connection failure means, naming the URL and the likely fix."""
    where = _endpoint(exc, url)
    cause = _root_cause(exc)
    names = _class_names(cause) | _class_names(exc)
    detail = f" ({type(cause).__name__}: {cause})" if cause is not exc or str(cause) else ""
    if names & _DROPPED:
        return (
            f"the connection to {where} dropped mid-request{detail}: the server closed it or stopped before "
            "the reply was complete (see the server's log)"
        )
    if names & _REFUSED:
        return f"nothing answers at {where}{detail}: is the server running there? (check provider.base_url)"
    return f"cannot reach {where}{detail} (check provider.base_url)"


def not_found_message(message: str, exc: BaseException, *, url: str | None) -> str:
    """A 404 with the URL, and the fix when the path lacks the ``/v1`` prefix compatible servers use."""
    where = _endpoint(exc, url)
    if "/v1" not in where and url and "/v1" not in url:
        return (
            f"{message} at {where}: OpenAI-compatible servers serve their API under /v1; "
            f"try provider.base_url={url.rstrip('/')}/v1"
        )
    return f"{message} at {where} (check provider.base_url and provider.model)"


# Request fields OpenAI's and Anthropic's own APIs take but compatible servers and proxies may refuse, and the
# setting that leaves each out (conf/provider/*.yaml, ``wire:``).
_WIRE_FIELDS = (
    ("reasoning", "provider.wire.reasoning_effort=false"),
    ("stream_options", "provider.wire.stream_usage=false"),
    ("parallel_tool_calls", "provider.wire.parallel_tool_calls=null"),
    ("max_completion_tokens", "provider.wire.max_tokens_field=max_tokens"),
    ("store", "provider.wire.store=null"),
    ("metadata", "provider.wire.metadata={}"),
)
_REFUSAL_WORDS = ("support", "unrecognized", "unknown", "not allowed", "not permitted", "extra", "unexpected")


def refused_field_hint(message: str) -> str:
    """A 400 that refuses one of the optional request fields names the setting that leaves it out."""
    lowered = message.lower()
    if not any(word in lowered for word in _REFUSAL_WORDS):
        return message
    for field_name, setting in _WIRE_FIELDS:
        if field_name in lowered:
            return f"{message} (this server refuses the '{field_name}' field: set {setting})"
    return message


def classify_exception(exc: BaseException, *, provider: str, url: str | None = None) -> ProviderCallError:
    """Turn any SDK (or transport) exception into a ``ProviderCallError``.

    Works on both SDKs by duck typing (``status_code``, ``body``, ``response``) so one function serves the
    Anthropic and OpenAI exception trees alike. ``url`` (the configured base URL) is named in connection and
    not-found errors when the exception does not carry the request's own URL.
    """
    if isinstance(exc, ProviderCallError):
        return exc
    import anthropic
    import openai

    name = type(exc).__name__
    if isinstance(exc, anthropic.APITimeoutError | openai.APITimeoutError):
        where = _endpoint(exc, url)
        return ProviderCallError(
            f"request to {where} timed out ({name}; provider.timeout_s sets the limit)",
            kind="timeout",
            provider=provider,
        )
    if isinstance(exc, anthropic.APIConnectionError | openai.APIConnectionError):
        return ProviderCallError(connection_message(exc, url=url), kind="connection", provider=provider)
    if isinstance(exc, anthropic.APIResponseValidationError | openai.APIResponseValidationError):
        return ProviderResponseError(
            f"the SDK could not parse the response: {exc}", kind="bad_response", provider=provider
        )
    status: int | None = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    etype, code, emsg = _body_error(body)
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if isinstance(exc, anthropic.APIError | openai.APIError):
        kind = _TYPE_KINDS.get(etype or "") if etype else None
        if kind is None and status is not None and status != 200:
            kind = _STATUS_KINDS.get(status) or ("server" if status >= 500 else "bad_request")
        if kind is None:
            # An error event inside a 200 stream with a type we do not know: the reply is unusable.
            kind = "stream_error"
        message = emsg or str(exc)
        if kind == "bad_request" and is_context_length(etype, code, message):
            # Recorded as its own kind: never retried, and a sign to trim the history, not a flowllm bug.
            kind = "context_length"
        if kind == "server" and is_request_rejected(message):
            kind = "bad_request"
            message = (
                f"the server could not render or read this request (its chat template or parser refused it; "
                f"retrying the same request cannot help): {message.strip()}"
            )
        elif kind in ("server", "stream_error") and is_reply_unparsed(message):
            kind = "unparsed_reply"
            message = (
                f"the server could not read its model's reply in the model family's own format (the model wrote "
                f"outside its chat format; not retried unless provider.retry.retry_on lists unparsed_reply): "
                f"{message.strip()}"
            )
        if status == 404:
            message = not_found_message(message, exc, url=url)
        elif kind == "bad_request":
            message = refused_field_hint(message)
        return ProviderCallError(
            message,
            kind=kind,
            provider=provider,
            status=status,
            retry_after=_retry_after(headers),
            error_type=etype,
        )
    if isinstance(exc, ValueError):  # json decoding of a broken body, a malformed SSE event
        return ProviderResponseError(f"unusable response: {exc}", kind="bad_response", provider=provider)
    if _class_names(exc) & _TRANSPORT:  # raised by the transport while a stream was being read
        return ProviderCallError(connection_message(exc, url=url), kind="connection", provider=provider)
    return ProviderCallError(
        f"{name}: {exc}", kind="connection" if isinstance(exc, OSError) else "server", provider=provider
    )
