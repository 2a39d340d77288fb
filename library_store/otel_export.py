"""Recorded traces sent as OpenTelemetry spans over OTLP, or written as OTLP JSON (issue 39).

``OtelSink`` is a trace sink (``TraceStore.sinks``): every finished trace the store records
becomes the spans of ``otel_spans.trace_spans``, queued on a ``BatchSpanProcessor`` that
exports them off the caller's thread; feedback becomes a ``whetstone.feedback`` span in the
same trace, and each step of a learner (``learning``) a ``whetstone.learning.<step>`` span. Off by default: a face builds a sink only when asked (``--otel``,
``WHETSTONE_OTEL=1``, ``Engine(otel=True)``), and OpenTelemetry is imported only then.

Where spans go is OpenTelemetry's own configuration, read by the exporters:
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
``OTEL_EXPORTER_OTLP_PROTOCOL`` (``http/protobuf``, the default, or ``grpc``),
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``.
Content (task, answer, messages, tool data) is sent only with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` or ``--otel-content``.
"""

from __future__ import annotations

import atexit
import base64
import errno
import json
import logging
import os
import stat
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.errors import ConfigError
from ..engine.types import Trace
from .otel_spans import (
    SpanRecord,
    feedback_span,
    learning_span,
    trace_spans,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanProcessor

log = logging.getLogger("whetstone.otel")

TRUE = frozenset({"1", "true", "yes", "on"})
# OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: "true", or the newer GenAI modes that
# keep content somewhere (span and/or event); "NO_CONTENT", "false" and unset keep it out.
CONTENT_ON = TRUE | {"span_only", "event_only", "span_and_event"}
PROTOCOLS = ("http/protobuf", "grpc")
SCOPE = "whetstone"
# How many exported trace ids a sink remembers, so the same trace recorded twice (a score
# added later) is not sent as a second tree.
REMEMBERED = 10_000


def flag_on(value: str | None) -> bool:
    """Whether an environment value such as ``WHETSTONE_OTEL`` says yes."""
    return (value or "").strip().lower() in TRUE


@dataclass(frozen=True)
class OtelSettings:
    """What to export and where: OTLP over ``protocol`` when ``otlp`` (the endpoint is the
    exporter's, from the ``OTEL_EXPORTER_OTLP_*`` variables), OTLP JSON lines to ``file``,
    or both; message content only when ``content``."""

    otlp: bool = True
    protocol: str = "http/protobuf"
    content: bool = False
    file: Path | None = None


def otel_settings(env: Mapping[str, str] | None = None, *, content: bool | None = None,
                  file: str | Path | None = None, otlp: bool | None = None) -> OtelSettings:
    """Settings from the standard variables; ``ConfigError`` when OTLP is asked for with no
    endpoint to send to, or with a protocol we do not speak. ``otlp`` None: OTLP when an
    endpoint is set or no ``file`` is given."""
    env = os.environ if env is None else env
    endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    if otlp is None:
        otlp = bool(endpoint) or file is None
    if otlp and not endpoint:
        raise ConfigError(
            "OpenTelemetry export is on but no OTLP endpoint is set",
            hint="set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://localhost:6006 for Arize "
                 "Phoenix, http://localhost:4318 for a collector), or write spans to a file "
                 "with --otel-file PATH")
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
    if otlp and protocol not in PROTOCOLS:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported",
                          hint="use http/protobuf or grpc")
    if content is None:
        content = (env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT") or ""
                   ).strip().lower() in CONTENT_ON
    return OtelSettings(otlp=otlp, protocol=protocol, content=content,
                        file=Path(file).expanduser() if file is not None else None)


def otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """``spans`` as one ``ExportTraceServiceRequest`` in the OTLP/JSON encoding: protobuf's
    JSON mapping with lowerCamelCase names and integer enums, and trace and span ids as hex,
    as OTLP/JSON requires (protobuf's own mapping would write them as base64)."""
    # lazy: OpenTelemetry loads only when export is on
    from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource in doc.get("resourceSpans", ()):
        for scope in resource.get("scopeSpans", ()):
            for span in scope.get("spans", ()):
                for holder in (span, *span.get("links", ())):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in holder:
                            holder[key] = base64.b64decode(holder[key]).hex()
    return doc


def _open_spans_file(path: Path) -> int:
    """``path`` opened to append, as a regular file: a symbolic link there is refused
    (``O_NOFOLLOW``), not followed to whatever it names, and a FIFO or a device is refused
    by ``fstat`` on the descriptor (``O_NONBLOCK``: opening a FIFO cannot hang)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK \
        | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symbolic link; spans are written only to a "
                                       "regular file") from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise OSError(errno.ENXIO, "it is not a regular file (a FIFO)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "it is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _file_exporter(path: Path) -> SpanExporter:
    """An exporter that appends each batch to ``path`` as one line of OTLP/JSON (the layout
    of the OpenTelemetry Collector's file exporter)."""
    # lazy: OpenTelemetry loads only when export is on
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class OtlpJsonFileExporter(SpanExporter):
        def __init__(self) -> None:
            self._lock = threading.Lock()
            path.parent.mkdir(parents=True, exist_ok=True)
            try:  # a bad path is said at the start, not at the first batch
                os.close(_open_spans_file(path))
            except OSError as exc:
                raise ConfigError(f"cannot write spans to {path}: {exc.strerror or exc}",
                                  hint="--otel-file (OtelSettings.file) names a regular "
                                       "file (or a new one), never a link") from None

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            line = json.dumps(otlp_json(spans), ensure_ascii=False, separators=(",", ":"))
            try:
                with self._lock, os.fdopen(_open_spans_file(path), "a", encoding="utf-8") as f:
                    f.write(line + "\n")
            except OSError as exc:
                log.error("could not write spans to %s: %s", path, exc)
                return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

    return OtlpJsonFileExporter()


def _otlp_exporter(protocol: str) -> SpanExporter:
    # No arguments: the exporter reads the OTEL_EXPORTER_OTLP_* variables itself (endpoint,
    # headers, certificates, compression, timeout), exactly as every OpenTelemetry SDK does.
    if protocol == "grpc":
        # lazy: OpenTelemetry loads only when export is on
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter()
    # lazy: OpenTelemetry loads only when export is on
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )
    return HttpExporter()


class OtelSink:
    """A trace sink sending each finished trace, and each feedback, as spans.

    ``processors`` receive the SDK spans (a ``BatchSpanProcessor`` per exporter in
    ``build_otel_sink``; tests may pass a ``SimpleSpanProcessor``). ``flush`` waits until
    what was queued is exported; ``close`` flushes and shuts the processors down (also at
    interpreter exit, so a script that never closes its ``Engine`` loses no span)."""

    def __init__(self, processors: Sequence[SpanProcessor], *, content: bool = False,
                 resource: Mapping[str, Any] | None = None) -> None:
        # lazy: OpenTelemetry loads only when export is on
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.processors = tuple(processors)
        self.content = content
        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; our name is
        # only the default, where neither gives one (it would say "unknown_service").
        made = Resource.create({"service.version": whetstone_version(), **dict(resource or {})})
        if str(made.attributes.get("service.name", "")).startswith("unknown_service"):
            made = made.merge(Resource({"service.name": "whetstone"}))
        self._resource = made
        self._scope = InstrumentationScope(SCOPE, whetstone_version())
        self._sent: OrderedDict[str, float | None] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(_close_at_exit, weakref.ref(self))

    def recorded(self, trace: Trace) -> None:
        """Export a trace the store recorded; a ``running`` record is skipped (the final one
        follows), and a trace sent before is sent again only as its new score."""
        if trace.outcome == "running" or self._closed:
            return
        with self._lock:
            seen = trace.id in self._sent
            before = self._sent.get(trace.id)
            self._sent[trace.id] = trace.score
            self._sent.move_to_end(trace.id)
            while len(self._sent) > REMEMBERED:
                self._sent.popitem(last=False)
        if not seen:
            self._send(trace_spans(trace, content=self.content))
        elif trace.score is not None and trace.score != before:
            self._send([feedback_span(trace, trace.score, None, content=False)])

    def feedback(self, trace: Trace, score: float, comment: str | None) -> None:
        """Export a label given to ``trace`` as a ``whetstone.feedback`` span in its trace."""
        if self._closed:
            return
        with self._lock:
            if trace.id in self._sent:
                self._sent[trace.id] = score
        self._send([feedback_span(trace, score, comment, content=self.content)])

    def learning(self, step: Mapping[str, Any]) -> None:
        """Export a step of learning in production (a canary started, promoted, rolled
        back: ``whetstone learn``) as a ``whetstone.learning.<step>`` span."""
        if self._closed:
            return
        self._send([learning_span(step)])

    def _send(self, records: Sequence[SpanRecord]) -> None:
        for span in (self._span(r) for r in records):
            for processor in self.processors:
                processor.on_end(span)

    def _span(self, r: SpanRecord) -> ReadableSpan:
        # lazy: OpenTelemetry loads only when export is on
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        flags = TraceFlags(TraceFlags.SAMPLED)
        context = SpanContext(r.trace_id, r.span_id, is_remote=False, trace_flags=flags)
        parent = (SpanContext(r.trace_id, r.parent_id, is_remote=False, trace_flags=flags)
                  if r.parent_id is not None else None)
        status = (Status(StatusCode.ERROR, r.error) if r.error is not None
                  else Status(StatusCode.UNSET))
        return ReadableSpan(
            name=r.name, context=context, parent=parent, resource=self._resource,
            attributes=dict(r.attributes),
            events=[Event(e.name, dict(e.attributes), e.time_ns) for e in r.events],
            kind=SpanKind.CLIENT if r.kind == "client" else SpanKind.INTERNAL,
            status=status, start_time=r.start_ns, end_time=r.end_ns,
            instrumentation_scope=self._scope)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export what is queued; False when a processor did not finish in time."""
        return all(p.force_flush(int(timeout_s * 1000)) for p in self.processors)

    def close(self) -> None:
        """Flush and shut down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for p in self.processors:
            try:
                p.force_flush()
                p.shutdown()
            except Exception as exc:  # noqa: BLE001 - an exporter failing at exit is a note
                log.warning("OpenTelemetry export did not shut down cleanly: %s", exc)


def _close_at_exit(ref: weakref.ref[OtelSink]) -> None:
    """Flush a sink nobody closed (a script that never closed its ``Engine``)."""
    sink = ref()
    if sink is not None:
        sink.close()


def build_otel_sink(settings: OtelSettings) -> OtelSink:
    """The sink ``settings`` describe: a ``BatchSpanProcessor`` for OTLP and one for the
    file (the OpenTelemetry SDK's queue, sizes and delays, ``OTEL_BSP_*``)."""
    # lazy: OpenTelemetry loads only when export is on
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = ([_otlp_exporter(settings.protocol)] if settings.otlp else []) + (
        [_file_exporter(settings.file)] if settings.file is not None else [])
    return OtelSink([BatchSpanProcessor(e) for e in exporters], content=settings.content)


def otel_sinks(otel: bool | OtelSettings | None,
               env: Mapping[str, str] | None = None) -> list[OtelSink]:
    """The exporter a face owns: one when ``otel`` is True or settings, or None with
    ``WHETSTONE_OTEL=1``; none otherwise (and then OpenTelemetry is never imported)."""
    env = os.environ if env is None else env
    if otel is None:
        otel = flag_on(env.get("WHETSTONE_OTEL"))
    if otel is False:
        return []
    return [build_otel_sink(otel if isinstance(otel, OtelSettings) else otel_settings(env))]


def whetstone_version() -> str:
    """The installed whetstone-engine version (``0+unknown`` from a bare checkout)."""
    try:
        return version("whetstone-engine")
    except PackageNotFoundError:
        return "0+unknown"


__all__ = ["OtelSettings", "OtelSink", "build_otel_sink", "flag_on", "otel_settings",
           "otel_sinks", "otlp_json", "whetstone_version"]
