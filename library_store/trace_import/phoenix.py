"""A Phoenix server's spans, read over its REST API.

``GET {url}/v1/projects/{project}/spans?limit=1000&cursor=...`` returns ``{"data": [span],
"next_cursor": ...}``; a span is ``{"id", "name", "context": {"trace_id", "span_id"},
"span_kind", "parent_id", "start_time", "end_time", "status_code", "status_message",
"attributes", "events"}`` with the attributes flattened (``llm.input_messages.0.message.role``)
and the OpenInference span kind moved out of them into ``span_kind``. Annotations give the
score: the root spans' (``GET {url}/v1/projects/{project}/span_annotations?span_ids=...``),
else the trace's (``.../trace_annotations?trace_ids=...``), each ``{"data": [{"span_id" or
"trace_id", "name", "result": {"score", "label", "explanation"}}], "next_cursor"}``; a 404
there means none (Phoenix answers 404 when none of the ids asked about has any). This is the
shape Phoenix 20.26.1 serves (its ``/openapi.json``); tests/test_phoenix_real.py reads a
real server, tests/test_traces_import.py a stand-in of the same shape.
``PHOENIX_API_KEY``, when set, is sent as a bearer token.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from whetstone.engine.errors import ConfigError, NotFound
from whetstone.library_store.trace_import.common import BadRecord, Imported, iso_seconds, parse_json
from whetstone.library_store.trace_import.otlp import group_traces
from whetstone.library_store.trace_import.spans import Span

PAGE = 1000  # the most spans the API returns per page
MAX_SPANS = 200_000  # stop paging past this many: an import is not a database dump
_SCORE_NAMES = ("correctness", "score", "correct", "accuracy")
Fetch = Callable[[str], Any]


def span_of(raw: Any) -> Span:
    """One span of the ``/spans`` response as a ``Span``; ``BadRecord`` saying why not."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("context"), Mapping):
        raise BadRecord("not a span (no context)")
    ctx = raw["context"]
    if not ctx.get("trace_id") or not ctx.get("span_id"):
        raise BadRecord("the span's context has no trace_id or span_id")
    attrs = raw.get("attributes") or {}
    if not isinstance(attrs, Mapping):
        raise BadRecord("the span's attributes are not an object")
    error = None
    if raw.get("status_code") == "ERROR":
        error = str(raw.get("status_message") or "the span's status is ERROR")
    return Span(trace_id=str(ctx["trace_id"]), span_id=str(ctx["span_id"]),
                parent_id=str(raw["parent_id"]) if raw.get("parent_id") else None,
                name=str(raw.get("name") or ""),
                start=iso_seconds(raw.get("start_time"), "start_time"),
                end=iso_seconds(raw["end_time"], "end_time") if raw.get("end_time") else None,
                attrs=dict(attrs), error=error, kind=str(raw.get("span_kind") or ""))


def http_fetch(url: str, timeout: float = 30.0) -> Any:
    """GET ``url`` as JSON; errors as ``NotFound`` (404) or ``ConfigError`` with a hint."""
    headers = {"Accept": "application/json"}
    key = os.environ.get("PHOENIX_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return parse_json(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NotFound(f"the Phoenix server has no such project ({url})",
                           hint="check --project (a project name or id) and the URL") from None
        raise ConfigError(f"the Phoenix server answered {exc.code} for {url}",
                          hint="check the URL, and PHOENIX_API_KEY if the server needs a "
                               "key") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ConfigError(f"cannot reach the Phoenix server at {url} ({exc})",
                          hint="check that the server runs and the URL (e.g. "
                               "http://127.0.0.1:6006)") from None
    except ValueError as exc:
        raise ConfigError(f"the Phoenix server's answer at {url} is not JSON ({exc})",
                          hint="--phoenix takes the server's base URL") from None


def _pages(base: str, fetch: Fetch) -> Iterator[Any]:
    cursor: str | None = None
    seen = 0
    while True:
        query = {"limit": PAGE, **({"cursor": cursor} if cursor else {})}
        page = fetch(f"{base}/spans?{urllib.parse.urlencode(query)}")
        if not isinstance(page, Mapping) or not isinstance(page.get("data"), list):
            raise ConfigError(f"the Phoenix server's spans at {base}/spans are not "
                              "{data: [...]}", hint="--phoenix takes the server's base URL")
        yield from page["data"]
        seen += len(page["data"])
        cursor = page.get("next_cursor")
        if not cursor or not page["data"] or seen >= MAX_SPANS:
            return


def _annotations(url: str, key: str, ids: list[str], fetch: Fetch,
                 notes: list[str]) -> dict[str, list[Mapping[str, Any]]]:
    """The annotations with a result at ``url`` (``span_annotations`` or ``trace_annotations``)
    for ``ids``, by the id under ``key``; every page, 100 ids a request."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for i in range(0, len(ids), 100):
        cursor: str | None = None
        while True:
            query = urllib.parse.urlencode([(f"{key}s", x) for x in ids[i:i + 100]]
                                           + [("limit", PAGE)]
                                           + ([("cursor", cursor)] if cursor else []))
            try:
                page = fetch(f"{url}?{query}")
            except NotFound:
                break  # Phoenix's answer when none of these ids has an annotation
            except ConfigError as exc:
                notes.append(f"annotations not read: {exc.message}")
                return found
            if not isinstance(page, Mapping):
                break
            for a in page.get("data") or ():
                if isinstance(a, Mapping) and isinstance(a.get("result"), Mapping):
                    found.setdefault(str(a.get(key)), []).append(a)
            cursor = page.get("next_cursor")
            if not cursor or not page.get("data"):
                break
    return found


def _annotate(spans: list[Span], base: str, fetch: Fetch, notes: list[str]) -> None:
    """Put the annotations of each root span (else of its trace) on the root as
    ``whetstone.score``/``verdict``/``feedback`` (what its own attributes do not say)."""
    roots = {s.span_id: s for s in spans if not s.parent_id}
    by_span = _annotations(f"{base}/span_annotations", "span_id", list(roots), fetch, notes)
    rest = sorted({s.trace_id for s in roots.values() if s.span_id not in by_span})
    by_trace = _annotations(f"{base}/trace_annotations", "trace_id", rest, fetch,
                            notes) if rest else {}
    for root in roots.values():
        notes_of = by_span.get(root.span_id) or by_trace.get(root.trace_id)
        if not notes_of:
            continue
        pick = next((a for n in _SCORE_NAMES for a in notes_of if a.get("name") == n),
                    notes_of[0])
        result = pick["result"]
        for key, value in (("whetstone.score", result.get("score")),
                           ("whetstone.verdict", result.get("label")),
                           ("whetstone.feedback", result.get("explanation"))):
            if value is not None and key not in root.attrs:
                root.attrs[key] = value


def read_phoenix(url: str, project: str, skipped: list[str], notes: list[str],
                 fetch: Fetch = http_fetch) -> Iterator[Imported]:
    """The traces of ``project`` on the Phoenix server at ``url``; a span or trace that cannot
    be read goes to ``skipped`` (a trace with an unreadable span is skipped whole)."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--phoenix {url!r} is not an http(s) URL",
                          hint="e.g. --phoenix http://127.0.0.1:6006 --project default")
    base = f"{url.rstrip('/')}/v1/projects/{urllib.parse.quote(project, safe='')}"
    source = f"{url.rstrip('/')} project {project}"
    spans: list[Span] = []
    broken: set[str] = set()
    for i, raw in enumerate(_pages(base, fetch)):
        try:
            spans.append(span_of(raw))
        except BadRecord as exc:
            ctx = raw.get("context") if isinstance(raw, Mapping) else None
            tid = ctx.get("trace_id") if isinstance(ctx, Mapping) else None
            if tid:
                broken.add(str(tid))
            skipped.append(f"{source}: span {i}: {exc}")
    for tid in sorted(broken):
        skipped.append(f"{source}: trace {tid}: skipped whole, one of its spans is unreadable")
    spans = [s for s in spans if s.trace_id not in broken]
    _annotate(spans, base, fetch, notes)
    yield from group_traces(iter([("", s) for s in spans]), "phoenix", source, skipped)


__all__ = ["http_fetch", "read_phoenix", "span_of"]
