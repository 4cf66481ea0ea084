"""Traces over OTLP/HTTP with the OpenTelemetry SDK, off unless the environment asks.

Set `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) and every
process llmgw starts (`llmgw serve` and its workers, the Celery workers) sends its spans
there in batches; the SDK reads the other standard variables itself (`OTEL_SERVICE_NAME`,
default `llmgw`; `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`,
`OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`). `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none` keeps it off. docs/tracing.md says what each span holds.

Off, `TRACER` is None and the request path only looks at it: no SDK is imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("llmgw.tracing")

TRACER: Any = None  # an opentelemetry Tracer once configured; None: tracing is off
_provider: Any = None


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def configure() -> bool:
    """Start sending spans when the environment asks (once a process); whether it does."""
    global TRACER, _provider
    if TRACER is not None or not wanted():
        return TRACER is not None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from .version import installed

    attributes = {"service.version": installed()}
    if not os.environ.get("OTEL_SERVICE_NAME", "").strip():
        attributes["service.name"] = "llmgw"
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    use(provider)
    log.info("sending traces over OTLP/HTTP to %s", _endpoint())
    return True


def use(provider: Any) -> None:
    """Trace with `provider` (an SDK TracerProvider; tests give one with an in-memory
    exporter), or stop tracing with None."""
    global TRACER, _provider
    _provider = provider
    TRACER = None if provider is None else provider.get_tracer("llmgw")


def flush() -> None:
    """Send what is batched now (a process about to end)."""
    if _provider is not None:
        with contextlib.suppress(Exception):
            _provider.force_flush(5000)


_OFF = contextlib.nullcontext()  # entered as None: one shared object, nothing made


def span(name: str, kind: str = "INTERNAL", **attributes: Any) -> contextlib.AbstractContextManager:
    """A child of the current span (`with span(...) as s`), or, while tracing is off,
    nothing: `s` is None. `kind`: INTERNAL, SERVER or CLIENT."""
    tracer = TRACER
    if tracer is None:
        return _OFF
    from opentelemetry.trace import SpanKind

    return tracer.start_as_current_span(
        name, kind=getattr(SpanKind, kind), attributes=_clean(attributes)
    )


def said(s: Any, **attributes: Any) -> None:
    """Set attributes on `s` (a span, or None while tracing is off)."""
    if s is not None:
        s.set_attributes(_clean(attributes))


def inject(headers: dict[str, str]) -> None:
    """Add the current span's W3C `traceparent` (and `tracestate`) to outgoing headers."""
    if TRACER is not None:
        from opentelemetry.propagate import inject as otel_inject

        otel_inject(headers)


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes as OpenTelemetry takes them: no None (an unknown is absent)."""
    return {k: v for k, v in attributes.items() if v is not None}


def _endpoint() -> str:
    return (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )
