"""OTLP JSON files: the protobuf JSON mapping of ``ExportTraceServiceRequest``.

A file is one request object (``{"resourceSpans": [...]}``) or, as the OpenTelemetry
Collector's file exporter writes, one request per line. Spans are grouped by ``traceId``;
each group becomes one trace (``spans.trace_of_spans``). Attribute values are
``{"stringValue"|"intValue"|"doubleValue"|"boolValue"|"arrayValue"|"kvlistValue"|...}``;
ids are hex (the OTLP/JSON rule) or base64 (the plain protobuf JSON mapping); snake_case field
names (``resource_spans``, ``string_value``) are read too.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping
from typing import Any

from whetstone.library_store.trace_import.common import BadRecord, Imported, parse_json
from whetstone.library_store.trace_import.spans import Span, trace_of_spans

_HEX = re.compile(r"[0-9a-fA-F]+")


def _get(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` under its camelCase or snake_case spelling."""
    if name in obj:
        return obj[name]
    snake = re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
    return obj.get(snake)


def any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as a plain value."""
    if not isinstance(value, Mapping):
        return value
    for name, kind in (("stringValue", str), ("boolValue", bool)):
        v = _get(value, name)
        if v is not None:
            return v if isinstance(v, kind) else kind(v)
    v = _get(value, "intValue")
    if v is not None:
        return int(v)  # int64 is a JSON string in the mapping
    v = _get(value, "doubleValue")
    if v is not None:
        return float(v)
    v = _get(value, "arrayValue")
    if v is not None:
        return [any_value(x) for x in (_get(v, "values") or ())]
    v = _get(value, "kvlistValue")
    if v is not None:
        return {kv.get("key"): any_value(kv.get("value")) for kv in (_get(v, "values") or ())}
    v = _get(value, "bytesValue")
    return v


def attributes(items: Any) -> dict[str, Any]:
    """A list of ``{key, value}`` as a flat dict (array values of messages stay lists)."""
    out: dict[str, Any] = {}
    for kv in items or ():
        if not isinstance(kv, Mapping) or not isinstance(kv.get("key"), str):
            raise BadRecord("an attribute is not {key, value}")
        out[kv["key"]] = any_value(kv.get("value"))
    return out


def hex_id(value: Any, size: int, what: str) -> str:
    """A trace or span id (``size`` bytes) as lower-case hex, from hex or base64."""
    if isinstance(value, str) and len(value) == 2 * size and _HEX.fullmatch(value):
        return value.lower()
    if isinstance(value, str) and value:
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) == size:
            return raw.hex()
    raise BadRecord(f"{what} {str(value)[:60]!r} is not a {size}-byte id (hex or base64)")


def _seconds(value: Any, what: str) -> float:
    try:
        return int(value) / 1e9
    except (TypeError, ValueError):
        raise BadRecord(f"{what} {str(value)[:40]!r} is not a time in nanoseconds") from None


def _span(raw: Any, resource: Mapping[str, Any]) -> Span:
    if not isinstance(raw, Mapping):
        raise BadRecord("a span is not an object")
    status = _get(raw, "status") or {}
    code = status.get("code") if isinstance(status, Mapping) else None
    error = None
    if code in (2, "2", "STATUS_CODE_ERROR", "ERROR"):
        error = str(status.get("message") or "the span's status is ERROR")
    parent = _get(raw, "parentSpanId")
    end = _get(raw, "endTimeUnixNano")
    return Span(trace_id=hex_id(_get(raw, "traceId"), 16, "traceId"),
                span_id=hex_id(_get(raw, "spanId"), 8, "spanId"),
                parent_id=hex_id(parent, 8, "parentSpanId") if parent else None,
                name=str(raw.get("name") or ""),
                start=_seconds(_get(raw, "startTimeUnixNano"), "startTimeUnixNano"),
                end=None if end in (None, "", 0, "0") else _seconds(end, "endTimeUnixNano"),
                attrs={**resource, **attributes(raw.get("attributes"))}, error=error)


def spans_of_request(request: Any, where: str) -> Iterator[tuple[str, Span | BadRecord]]:
    """Every span of one ``ExportTraceServiceRequest``, or the ``BadRecord`` it is, each with
    where it sits (``resourceSpans[0].scopeSpans[1].spans[2]``)."""
    if not isinstance(request, Mapping) or _get(request, "resourceSpans") is None:
        yield where, BadRecord("not an OTLP trace request (no resourceSpans)")
        return
    for i, rs in enumerate(_get(request, "resourceSpans") or ()):
        here = f"{where}resourceSpans[{i}]"
        try:
            resource = attributes((rs.get("resource") or {}).get("attributes"))
            scopes = _get(rs, "scopeSpans") or _get(rs, "instrumentationLibrarySpans") or ()
        except (BadRecord, AttributeError, TypeError, ValueError) as exc:
            yield here, BadRecord(str(exc))
            continue
        for j, ss in enumerate(scopes):
            for k, raw in enumerate((ss.get("spans") if isinstance(ss, Mapping) else None)
                                    or ()):
                at = f"{here}.scopeSpans[{j}].spans[{k}]"
                try:
                    yield at, _span(raw, resource)
                except BadRecord as exc:
                    yield at, exc
                except (TypeError, ValueError, AttributeError) as exc:
                    yield at, BadRecord(f"unreadable span ({exc})")


def _requests(text: str) -> Iterator[tuple[str, Any]]:
    """The request objects of a file: the whole file, or one per line."""
    try:
        yield "", parse_json(text)
        return
    except ValueError:
        pass
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield f"line {n}: ", parse_json(line)
            except ValueError as exc:
                yield f"line {n}: ", BadRecord(f"not JSON ({exc})")


def group_traces(found: Iterator[tuple[str, Span | BadRecord]], fmt: str, source: str,
                 skipped: list[str]) -> Iterator[Imported]:
    """Spans grouped by trace id, each group one trace; a trace with a bad span is skipped
    whole (never half imported), and so is one that holds no run."""
    by_trace: dict[str, list[Span]] = {}
    for where, item in found:
        if isinstance(item, BadRecord):
            skipped.append(f"{source}: {where}: {item}")
        else:
            by_trace.setdefault(item.trace_id, []).append(item)
    for trace_id, spans in by_trace.items():
        try:
            yield trace_of_spans(spans, fmt, source)
        except BadRecord as exc:
            skipped.append(f"{source}: trace {trace_id}: {exc}")


def read_otlp(text: str, source: str, skipped: list[str]) -> Iterator[Imported]:
    """The traces of an OTLP JSON file's ``text``; what cannot be read goes to ``skipped``.

    A span that cannot be read cannot be placed in its trace either, so it is reported alone
    and its trace is built from the rest only when that span's trace id is readable; when it
    is, the whole trace is skipped."""
    found: list[tuple[str, Span | BadRecord]] = []
    broken: set[str] = set()
    for prefix, request in _requests(text):
        if isinstance(request, BadRecord):
            found.append((prefix.rstrip(": "), request))
            continue
        for where, item in spans_of_request(request, prefix):
            if isinstance(item, BadRecord):
                tid = _trace_id_of(request, where)
                if tid:
                    broken.add(tid)
            found.append((where, item))
    kept = [(w, s) for w, s in found if isinstance(s, BadRecord) or s.trace_id not in broken]
    for tid in sorted(broken):
        skipped.append(f"{source}: trace {tid}: skipped whole, one of its spans is unreadable")
    yield from group_traces(iter(kept), "otlp-json", source, skipped)


def _trace_id_of(request: Any, where: str) -> str | None:
    """The readable trace id of the span at ``where``, if any (to skip its trace whole)."""
    m = re.search(r"resourceSpans\[(\d+)\]\.scopeSpans\[(\d+)\]\.spans\[(\d+)\]", where)
    if not m:
        return None
    try:
        rs = (_get(request, "resourceSpans") or [])[int(m.group(1))]
        ss = (_get(rs, "scopeSpans") or _get(rs, "instrumentationLibrarySpans"))[int(m.group(2))]
        return hex_id(_get(ss["spans"][int(m.group(3))], "traceId"), 16, "traceId")
    except (BadRecord, LookupError, TypeError, AttributeError):
        return None


__all__ = ["any_value", "attributes", "group_traces", "hex_id", "read_otlp",
           "spans_of_request"]
