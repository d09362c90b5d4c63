"""The OTLP/HTTP span pipeline: the OpenTelemetry SDK's tracer provider and exporter, guarded so that a receiver
that goes away costs one warning and nothing else (later batches are dropped, not retried).

The SDK is an optional extra (``pip install "flowllm[telemetry]"``): ``open_pipeline`` raises
``TelemetryUnavailable`` with that command when it is missing.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

INSTALL = 'pip install "flowllm[telemetry]"'
TRACES_PATH = "/v1/traces"
SERVICE_NAME = "flowllm"
CONNECT_TIMEOUT_S = 3.0
EXPORT_TIMEOUT_S = 5.0
# The SDK's exporter logs every failed batch; the guard says it once.
SDK_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


class TelemetryUnavailable(ImportError):
    """The OpenTelemetry SDK or its OTLP exporter is not installed; the message is the install command."""


class EndpointError(ValueError):
    """The OTLP endpoint is not a URL, or nothing answers there: one line."""


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of an endpoint given as ``http://host:port`` (``/v1/traces`` added) or in full."""
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointError(
            f"telemetry.otlp_endpoint must be an http(s) URL such as http://127.0.0.1:6006, not '{endpoint}'"
        )
    path = parts.path.rstrip("/")
    if not path.endswith(TRACES_PATH):
        path += TRACES_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def unreachable(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why nothing can be sent to ``url`` (a refused or timed-out connection), or None when it accepts one."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"cannot reach the OTLP endpoint {url}: {exc.strerror or exc}"


def require_sdk() -> None:
    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise TelemetryUnavailable(f"OpenTelemetry export needs the SDK and its OTLP exporter: {INSTALL}")


@dataclass
class ExportStatus:
    """How many spans reached the receiver, and the first failure (after which nothing more is sent)."""

    url: str
    sent: int = 0
    failure: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, ok: bool, count: int, reason: str) -> None:
        with self._lock:
            if ok:
                self.sent += count
            elif self.failure is None:
                self.failure = f"could not send spans to {self.url} ({reason}); nothing more is sent"
                log.warning("telemetry: %s", self.failure)


def _guarded(inner: SpanExporter, status: ExportStatus) -> SpanExporter:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class GuardedExporter(SpanExporter):
        """Counts what was sent; after the first failed batch says so once and drops the rest."""

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            if status.failure is not None:
                return SpanExportResult.FAILURE
            try:
                result = inner.export(spans)
            except Exception as exc:  # an exporter bug must not reach the run
                result, reason = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
            else:
                reason = "the receiver refused the spans or did not answer"
            status.record(result is SpanExportResult.SUCCESS, len(spans), reason)
            return result

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return inner.force_flush(timeout_millis)

    return GuardedExporter()


@dataclass
class SpanPipeline:
    """A tracer provider that sends to one OTLP endpoint, and what it has sent."""

    url: str
    provider: TracerProvider
    status: ExportStatus

    @property
    def tracer(self) -> Tracer:
        return self.provider.get_tracer("flowllm")

    def flush(self) -> None:
        self.provider.force_flush()

    def close(self) -> None:
        self.provider.shutdown()


def open_pipeline(endpoint: str, *, service_name: str = SERVICE_NAME, batch: bool = True) -> SpanPipeline:
    """A span pipeline to ``endpoint``. Raises ``TelemetryUnavailable`` or ``EndpointError`` (one line each)."""
    url = traces_url(endpoint)
    require_sdk()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    problem = unreachable(url)
    if problem is not None:
        raise EndpointError(problem)
    logging.getLogger(SDK_EXPORTER_LOGGER).setLevel(logging.CRITICAL)
    status = ExportStatus(url)
    exporter = _guarded(OTLPSpanExporter(endpoint=url, timeout=EXPORT_TIMEOUT_S), status)
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    return SpanPipeline(url, provider, status)
